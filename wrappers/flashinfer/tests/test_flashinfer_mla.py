"""flashinfer.rope / flashinfer.decode against mate.sparse_mla_interface.

Oracle: mate's own functions on the same inputs (bit-identical on the CPU reference; see
``same``). Also: outputs written into merged 576-value buffers and returned, reusable
metadata, upstream-only options raising ``NotImplementedError``, mate's errors reaching the
caller, the example script, and (GPU) the decode captured in a CUDA graph.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import flashinfer.decode as fd
import flashinfer.rope as fr
import pytest
import torch

import mate.sparse_mla_interface as mla
from mate.testing import assert_close, assert_equal, poisoned, rand_fp8, randn
from mate.testing.graphs import capture_graph

E4M3 = torch.float8_e4m3fn
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fp8_mla_decode.py"


def same(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-identical on the CPU (deterministic reference); on a GPU two launches may order
    fp32 sums differently (split top-k), so the output dtype's rounding is allowed."""
    if got.device.type == "cpu":
        assert_equal(got, expected)
    else:
        assert_close(got, expected)


def _rope_inputs(device, nnz, H, cache_dtype=torch.float32):
    cos_sin = torch.rand(40, 64, device=device).mul(2).sub(1).to(cache_dtype)
    pos = torch.randint(0, 40, (nnz,), device=device)
    return (randn((nnz, H, 64), device=device), randn((nnz, 64), device=device),
            randn((nnz, H, 512), device=device), randn((nnz, 512), device=device), cos_sin, pos)


@pytest.mark.parametrize("is_neox", [True, False])
def test_mla_rope_quantize_fp8_into_merged_buffers(device, is_neox):
    nnz, H = 5, 3
    q_rope, k_rope, q_nope, k_nope, cos_sin, pos = _rope_inputs(device, nnz, H)
    exp = mla.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, is_neox=is_neox,
                                    quant_scale_q=3.0, quant_scale_kv=0.5)
    q_fp8 = poisoned((nnz, H, 576), E4M3, device)
    kv_fp8 = poisoned((nnz, 576), E4M3, device)
    views = (q_fp8[..., 512:], kv_fp8[:, 512:], q_fp8[..., :512], kv_fp8[:, :512])
    got = fr.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, is_neox, None, 3.0, 0.5, *views,
                                   enable_pdl=True)
    assert len(got) == 4
    for g, v, e in zip(got, views, exp):
        assert g.data_ptr() == v.data_ptr() and g.stride() == v.stride()  # written in place and returned
        same(g, e)
    # Omitted outputs are allocated; an explicit quantize_dtype and an int32 pos_ids work too.
    alloc = fr.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos.int(), is_neox=is_neox,
                                     quantize_dtype=E4M3, quant_scale_q=3.0, quant_scale_kv=0.5)
    for g, e in zip(alloc, exp):
        same(g, e)


def test_mla_rope_quantize_fp8_errors_come_from_mate(device):
    q_rope, k_rope, q_nope, k_nope, cos_sin, pos = _rope_inputs(device, 2, 2)
    with pytest.raises(TypeError, match="q_rope"):
        fr.mla_rope_quantize_fp8(q_rope.float(), k_rope, q_nope, k_nope, cos_sin, pos)
    with pytest.raises(ValueError, match="quantize_dtype"):
        fr.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, quantize_dtype=torch.float8_e5m2)


def _decode_inputs(device, B=2, q_len=2, H=16, top_k=128, pages=5, page_size=64, four_d=False):
    query = rand_fp8((B, q_len, H, 576), device)
    kv_cache = rand_fp8((pages, 1, page_size, 576) if four_d else (pages, page_size, 576), device)
    n_tok = pages * page_size
    block_tables = torch.randint(0, n_tok, (B, q_len, top_k), dtype=torch.int32, device=device)
    block_tables[0, 0, :9] = -1  # invalid slots are skipped
    block_tables[-1, -1, -3:] = n_tok + 7  # out of range: skipped
    seq_lens = torch.full((B,), top_k, dtype=torch.int32, device=device)
    seq_lens[0] = top_k - 50  # the last 50 slots of batch 0 do not count
    return query, kv_cache, block_tables, seq_lens


def _decode_args(query, kv_cache, block_tables, seq_lens):
    return (query, kv_cache, None, 128, 512, 64, block_tables, seq_lens, 4096)


@pytest.mark.parametrize("four_d", [False, True])
def test_decode_matches_mate_with_out_lse_and_metadata(device, four_d):
    query, kv_cache, block_tables, seq_lens = _decode_inputs(device, four_d=four_d)
    B, q_len, H, _ = query.shape
    top_k = block_tables.shape[-1]
    scales = dict(bmm1_scale=0.04, bmm2_scale=0.5)
    exp_out, exp_lse = mla.sparse_mla_fp8_decode(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                                 sparse_mla_top_k=top_k, return_lse=True, **scales)
    metadata = fd.get_batch_decode_metadata_mla(query, seq_lens, top_k)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
    lse = poisoned((B * q_len, H), torch.float32, device)
    res = fd.trtllm_batch_decode_with_kv_cache_mla(
        *_decode_args(query, kv_cache, block_tables, seq_lens), top_k, out, backend="xqa", lse=lse,
        return_lse=True, metadata=metadata, enable_pdl=True, cute_dsl_impl="x", kv_scale_format="y", **scales)
    got_out, got_lse = res
    assert got_out is out and got_lse.data_ptr() == lse.data_ptr()
    same(got_out, exp_out)
    same(got_lse.view(B, q_len, H), exp_lse.view(B, q_len, H))
    # The same metadata after seq_lens changed, and without return_lse: only out comes back.
    seq_lens.copy_(torch.tensor([top_k, 3], dtype=torch.int32, device=device))
    exp2 = mla.sparse_mla_fp8_decode(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                     sparse_mla_top_k=top_k, **scales)
    out.fill_(float("nan"))
    got2 = fd.trtllm_batch_decode_with_kv_cache_mla(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                                    sparse_mla_top_k=top_k, out=out, metadata=metadata, **scales)
    assert got2 is out
    same(got2, exp2)


def test_decode_without_metadata_or_out(device):
    query, kv_cache, block_tables, seq_lens = _decode_inputs(device, B=1, q_len=1, H=8, top_k=64, pages=2)
    exp = mla.sparse_mla_fp8_decode(*_decode_args(query, kv_cache, block_tables, seq_lens), sparse_mla_top_k=64)
    same(fd.trtllm_batch_decode_with_kv_cache_mla(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                                  sparse_mla_top_k=64, backend="cute-dsl"), exp)


@pytest.mark.parametrize("name,value", [
    ("sparse_mla_top_k_lens", "tensor"), ("enable_dcp", True), ("cp_world", 2), ("cp_rank", 1),
    ("causal_seqlens_kv_global", "tensor"),
    # Passed to mate, which refuses them the same way (ignoring them would change the result).
    ("sinks", "tensor-list"), ("skip_softmax_threshold_scale_factor", 0.5), ("uses_shared_paged_kv_idx", False),
    ("cum_seq_lens_q", "tensor"), ("max_q_len", 2), ("bmm1_scale", "tensor"), ("bmm2_scale", "tensor"),
])
def test_decode_options_mate_does_not_implement_raise(device, name, value):
    query, kv_cache, block_tables, seq_lens = _decode_inputs(device, B=1, q_len=1, H=8, top_k=64, pages=2)
    if value == "tensor":
        value = torch.ones(1, dtype=torch.float32 if name.startswith("bmm") else torch.int32, device=device)
    elif value == "tensor-list":
        value = [torch.zeros(8, device=device)]
    with pytest.raises(NotImplementedError, match=name):
        fd.trtllm_batch_decode_with_kv_cache_mla(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                                 sparse_mla_top_k=64, **{name: value})


def test_decode_bad_inputs_raise_from_mate(device):
    query, kv_cache, block_tables, seq_lens = _decode_inputs(device, B=1, q_len=1, H=8, top_k=64, pages=2)
    args = list(_decode_args(query, kv_cache, block_tables, seq_lens))
    with pytest.raises(ValueError, match="kv_lora_rank"):
        fd.trtllm_batch_decode_with_kv_cache_mla(*args[:4], 256, *args[5:], sparse_mla_top_k=64)
    with pytest.raises(ValueError, match="sparse_mla_top_k"):  # dense MLA (upstream's default 0)
        fd.trtllm_batch_decode_with_kv_cache_mla(*args)
    with pytest.raises(TypeError, match="query"):
        fd.trtllm_batch_decode_with_kv_cache_mla(query.to(torch.bfloat16), *args[1:], sparse_mla_top_k=64)
    with pytest.raises(ValueError, match="backend"):
        fd.trtllm_batch_decode_with_kv_cache_mla(*args, sparse_mla_top_k=64, backend="no-such-backend")
    other = fd.get_batch_decode_metadata_mla(query, seq_lens, 128)  # made for another top-k
    with pytest.raises(ValueError):
        fd.trtllm_batch_decode_with_kv_cache_mla(*args, sparse_mla_top_k=64, metadata=other)


def test_example_runs(capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert "ok on" in capsys.readouterr().out


@pytest.mark.gpu
def test_example_runs_on_the_gpu(capsys):
    """The example at its DeepSeek-V3.2 decode size, on mate's Triton kernels."""
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert "ok on cuda" in capsys.readouterr().out


@pytest.mark.gpu
def test_rope_and_decode_in_a_cuda_graph():
    """RoPE + FP8 into the merged query buffer and the decode, captured once with reused
    metadata, then replayed after new inputs and seq_lens are copied in place."""
    dev = "cuda"
    B, q_len, H, top_k = 8, 2, 64, 2048
    query, kv_cache, block_tables, seq_lens = _decode_inputs(dev, B, q_len, H, top_k, pages=300)
    q_rope, k_rope, q_nope, k_nope, cos_sin, pos = _rope_inputs(dev, B * q_len, H)
    q_rows = query.view(B * q_len, H, 576)
    k_rows = torch.empty(B * q_len, 576, dtype=E4M3, device=dev)
    metadata = fd.get_batch_decode_metadata_mla(query, seq_lens, top_k)
    out = torch.empty(B, q_len, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, q_len, H, dtype=torch.float32, device=dev)

    def step():
        fr.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, quant_scale_q=2.0,
                                 quant_scale_kv=4.0, q_rope_out=q_rows[..., 512:], k_rope_out=k_rows[:, 512:],
                                 q_nope_out=q_rows[..., :512], k_nope_out=k_rows[:, :512])
        fd.trtllm_batch_decode_with_kv_cache_mla(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                                 sparse_mla_top_k=top_k, out=out, bmm1_scale=0.01, bmm2_scale=0.25,
                                                 lse=lse, return_lse=True, metadata=metadata)

    graph = capture_graph(step)
    for t in (q_rope, q_nope):
        t.copy_(randn(t.shape, device=dev))
    block_tables.random_(0, 300 * 64)
    seq_lens.copy_(torch.tensor([5, 2048, 1000, 0, 64, 2047, 1, 700], dtype=torch.int32, device=dev))
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    exp_q = mla.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, quant_scale_q=2.0,
                                      quant_scale_kv=4.0)
    same(q_rows[..., 512:], exp_q[0])
    same(q_rows[..., :512], exp_q[2])
    exp_out, exp_lse = mla.sparse_mla_fp8_decode(*_decode_args(query, kv_cache, block_tables, seq_lens),
                                                 sparse_mla_top_k=top_k, bmm1_scale=0.01, bmm2_scale=0.25,
                                                 return_lse=True)
    same(out, exp_out)
    same(lse, exp_lse)
