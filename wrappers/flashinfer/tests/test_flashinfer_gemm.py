"""flashinfer.gemm against mate.gemm: same results, out= identity, B views without copies, errors.

The wrapper is an adapter, so the oracle is mate's own function called on the same
inputs (see ``same``). mate's own tests check its
functions against float64 references.
"""

from __future__ import annotations

import flashinfer
import flashinfer.gemm as fg
import pytest
import torch

import mate.gemm
from mate.testing import assert_close, assert_equal, poisoned, rand_fp8, randn
from mate.testing.graphs import capture_graph

E4M3 = torch.float8_e4m3fn


def same(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Wrapper result vs mate's own result on the same inputs.

    On the CPU both run mate's deterministic reference: bit-identical. On a GPU two launches
    of one kernel may sum fp32 partial products in another order (split-K, autotuned
    configs), so the comparison allows the output dtype's rounding (mate.testing.DTYPE_TOL).
    """
    if got.device.type == "cpu":
        assert_equal(got, expected)
    else:
        assert_close(got, expected)


def _spy(monkeypatch, name):
    """Records the arguments mate.gemm.<name> receives, then runs it."""
    real = getattr(mate.gemm, name)
    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(mate.gemm, name, spy)
    return calls


@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
def test_bmm_bf16_matches_mate_and_passes_b_view(monkeypatch, device, dtype, out_dtype):
    b, m, k, n = 3, 37, 96, 72  # m and n not multiples of a tile
    A = randn((b, m, k), dtype, device)
    weight = randn((b, n, k), dtype, device)  # contiguous [b, n, k], as checkpoints store it
    B = weight.transpose(1, 2)  # [b, k, n] view, column-major as upstream expects
    expected = mate.gemm.bmm_bf16(A, B, out_dtype=out_dtype)
    calls = _spy(monkeypatch, "bmm_bf16")
    out = poisoned((b, m, n), out_dtype, device)
    got = flashinfer.bmm_bf16(A, B, out=out, out_dtype=out_dtype, backend="cudnn")
    assert got is out
    same(got, expected)
    (args, _), = calls
    assert args[1].data_ptr() == weight.data_ptr() and args[1].stride() == B.stride()  # no layout copy
    # Allocated output.
    same(fg.bmm_bf16(A, B, out_dtype=out_dtype), expected)


@pytest.mark.parametrize("channelwise", [False, True])
def test_bmm_fp8_matches_mate(monkeypatch, device, channelwise):
    b, m, k, n = 2, 33, 128, 80
    A = rand_fp8((b, m, k), device)
    weight = rand_fp8((b, n, k), device)
    B = weight.transpose(1, 2)
    if channelwise:  # mate extension: per row of A, per column of B
        A_scale = torch.rand(b, m, 1, device=device) + 0.5
        B_scale = torch.rand(b, 1, n, device=device) + 0.5
    else:
        A_scale = torch.tensor([0.75], device=device)
        B_scale = torch.tensor([1.5], device=device)
    expected = mate.gemm.bmm_fp8(A, B, A_scale, B_scale, torch.bfloat16)
    calls = _spy(monkeypatch, "bmm_fp8")
    out = poisoned((b, m, n), torch.bfloat16, device)
    got = flashinfer.bmm_fp8(A, B, A_scale, B_scale, torch.bfloat16, out, "cublas")
    assert got is out
    same(got, expected)
    (args, _), = calls
    assert args[1].data_ptr() == weight.data_ptr() and args[1].stride() == B.stride()
    same(fg.bmm_fp8(A, B, A_scale, B_scale, torch.bfloat16), expected)


def _groupwise_inputs(device, m, n, k, mode):
    kb, nb = k // 128, -(-n // 128)
    a, b = rand_fp8((m, k), device), rand_fp8((n, k), device)
    a_scale = torch.rand(m, kb, device=device) + 0.25
    b_scale = torch.rand(nb, kb, device=device) + 0.25
    if mode == "MN":
        a_scale, b_scale = a_scale.t().contiguous(), b_scale.t().contiguous()
    return a, b, a_scale, b_scale


@pytest.mark.parametrize("mode", ["K", "MN"])
def test_gemm_fp8_nt_groupwise_matches_mate(device, mode):
    m, n, k = 40, 200, 256  # n not a multiple of 128: a partial scale block
    a, b, a_scale, b_scale = _groupwise_inputs(device, m, n, k, mode)
    expected = mate.gemm.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode=mode)
    out = poisoned((m, n), torch.bfloat16, device)
    got = fg.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, mode, 2, (1, 128, 128), out, torch.bfloat16, "trtllm")
    assert got is out
    same(got, expected)
    half = fg.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode=mode, out_dtype=torch.float16)
    same(half, mate.gemm.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode=mode,
                                                       out_dtype=torch.float16))


def test_gemm_fp8_nt_groupwise_fp8_output(device):
    """mate's extension: ``output_scale`` is filled and the output is e4m3."""
    m, n, k = 24, 256, 128
    a, b, a_scale, b_scale = _groupwise_inputs(device, m, n, k, "K")
    exp_scale = poisoned((m, 2), torch.float32, device)
    expected = mate.gemm.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K",
                                               out=poisoned((m, n), E4M3, device), output_scale=exp_scale)
    scale = poisoned((m, 2), torch.float32, device)
    out = poisoned((m, n), E4M3, device)
    got = fg.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K", out=out, output_scale=scale)
    assert got is out
    same(got, expected)
    same(scale, exp_scale)


def test_group_deepgemm_fp8_nt_groupwise_matches_mate(device):
    G, n, k = 3, 136, 256
    m = 3 * 128
    a = rand_fp8((m, k), device)
    b = rand_fp8((G, n, k), device)
    a_scale = torch.rand(m, k // 128, device=device) + 0.25
    b_scale = torch.rand(G, -(-n // 128), k // 128, device=device) + 0.25
    # Three 128-aligned ranges, groups out of order, each ending with padding rows (-1).
    m_indices = torch.full((m,), -1, dtype=torch.int32, device=device)
    m_indices[0:100], m_indices[128:256], m_indices[256:300] = 2, 0, 1
    valid = m_indices >= 0
    expected = mate.gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indices)
    out = poisoned((m, n), torch.bfloat16, device)
    got = fg.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indices, (1, 128, 128), out, torch.bfloat16)
    assert got is out
    same(got[valid], expected[valid])  # padding rows are unspecified


def test_batch_deepgemm_fp8_nt_groupwise_matches_mate(device):
    G, max_m, n, k = 3, 64, 128, 256
    a = rand_fp8((G, max_m, k), device)
    b = rand_fp8((G, n, k), device)
    a_scale = torch.rand(G, max_m, k // 128, device=device) + 0.25
    b_scale = torch.rand(G, 1, k // 128, device=device) + 0.25
    masked_m = torch.tensor([64, 0, 17], dtype=torch.int32, device=device)  # full, empty, partial
    rows = torch.arange(max_m, device=device)[None, :] < masked_m[:, None]
    expected = mate.gemm.batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, masked_m, 32)
    out = poisoned((G, max_m, n), torch.bfloat16, device)
    got = fg.batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, masked_m, 32, out=out)
    assert got is out
    same(got[rows], expected[rows])  # rows at or past masked_m are unspecified


def test_bad_inputs_raise_from_mate(device):
    """The wrapper adds no validation of its own: mate's errors reach the caller."""
    A = randn((2, 8, 16), torch.bfloat16, device)
    B = randn((2, 16, 8), torch.bfloat16, device)
    with pytest.raises(TypeError, match="A"):
        fg.bmm_bf16(A.float(), B)
    with pytest.raises(ValueError, match="B"):
        fg.bmm_bf16(A, randn((2, 12, 8), torch.bfloat16, device))  # k mismatch
    with pytest.raises((TypeError, ValueError), match="out"):
        fg.bmm_bf16(A, B, out=torch.empty(2, 8, 9, dtype=torch.bfloat16, device=device))
    A8, B8 = rand_fp8((1, 8, 16), device), rand_fp8((1, 16, 8), device)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        fg.bmm_fp8(A8, B8, torch.ones(1, device=device), torch.ones(1, device=device), torch.float32)
    a, b, a_scale, b_scale = _groupwise_inputs(device, 8, 128, 128, "K")
    with pytest.raises(ValueError):
        fg.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_granularity_mnk=(1, 64, 64))


@pytest.mark.gpu
def test_gemms_in_a_cuda_graph():
    """Captured once, replayed with new inputs copied in place: matches eager mate."""
    dev = "cuda"
    A = rand_fp8((4, 16, 512), dev)
    B = rand_fp8((4, 384, 512), dev).transpose(1, 2)
    sa, sb = torch.tensor([0.5], device=dev), torch.tensor([2.0], device=dev)
    Ah, Bh = randn((4, 16, 512), torch.bfloat16, dev), randn((4, 384, 512), torch.bfloat16, dev).transpose(1, 2)
    a, b, a_scale, b_scale = _groupwise_inputs(dev, 64, 512, 1024, "K")
    G, max_m = 4, 32
    ga, gb = rand_fp8((G, max_m, 512), dev), rand_fp8((G, 256, 512), dev)
    gas, gbs = torch.rand(G, max_m, 4, device=dev) + 0.5, torch.rand(G, 2, 4, device=dev) + 0.5
    masked_m = torch.tensor([32, 5, 0, 17], dtype=torch.int32, device=dev)
    outs = [torch.empty(4, 16, 384, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    out_g = torch.empty(64, 512, dtype=torch.bfloat16, device=dev)
    out_m = torch.empty(G, max_m, 256, dtype=torch.bfloat16, device=dev)

    def step():
        fg.bmm_fp8(A, B, sa, sb, torch.bfloat16, out=outs[0])
        fg.bmm_bf16(Ah, Bh, out=outs[1])
        fg.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K", out=out_g)
        fg.batch_deepgemm_fp8_nt_groupwise(ga, gb, gas, gbs, masked_m, 16, out=out_m)

    graph = capture_graph(step)
    for t in (A, a, ga):
        t.copy_(rand_fp8(t.shape, dev))
    Ah.copy_(randn(Ah.shape, torch.bfloat16, dev))
    masked_m.copy_(torch.tensor([1, 32, 9, 0], dtype=torch.int32, device=dev))
    for o in (*outs, out_g, out_m):
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    same(outs[0], mate.gemm.bmm_fp8(A, B, sa, sb, torch.bfloat16))
    same(outs[1], mate.gemm.bmm_bf16(Ah, Bh))
    same(out_g, mate.gemm.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K"))
    rows = torch.arange(max_m, device=dev)[None, :] < masked_m[:, None]
    ref_m = mate.gemm.batch_deepgemm_fp8_nt_groupwise(ga, gb, gas, gbs, masked_m, 16)
    same(out_m[rows], ref_m[rows])


def test_adapters_trace_under_torch_compile(device):
    """Engines compile their models: the adapters must not break the graph around mate's custom ops."""
    A = randn((2, 16, 64), torch.bfloat16, device)
    B = randn((2, 48, 64), torch.bfloat16, device).transpose(1, 2)
    a, b, a_scale, b_scale = _groupwise_inputs(device, 16, 128, 128, "K")

    def f(A, B, a, b, a_scale, b_scale):
        x = fg.bmm_bf16(A, B, backend="cudnn")
        y = fg.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K", backend="cutlass")
        return x, y

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(A, B, a, b, a_scale, b_scale)
    for g, e in zip(got, f(A, B, a, b, a_scale, b_scale)):
        same(g, e)
