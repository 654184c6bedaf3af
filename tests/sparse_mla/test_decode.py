"""Tests of ``get_batch_decode_metadata_mla`` and ``sparse_mla_fp8_decode``.

CPU: the Triton kernels under the interpreter (``triton_backend``) against
``sparse_mla_decode_reference`` (itself checked against float64 loops in
``test_reference.py``). GPU (``gpu`` marker): the spec's shapes, CUDA-graph replay,
repeatability, and no allocation with prepared metadata.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mate.ops.sparse_mla.metadata import DecodeMetadata, plan_decode
from mate.ops.sparse_mla.reference import sparse_mla_decode_reference, sparse_mla_decode_reference_with_magnitude
from mate.sparse_mla_interface import get_batch_decode_metadata_mla, sparse_mla_fp8_decode
from mate.testing import assert_close, assert_equal, poisoned
from mate.testing.graphs import capture_graph
from tests._markers import interpreter_only

FP8 = torch.float8_e4m3fn

# Tolerances. out is bf16: the kernel rounds P to fp16 (relative 2**-11 per weight) and sums
# in another fp32 order than the reference, then both round to bf16 (2**-8 relative), so an
# output may differ by one bf16 unit: rtol 1.6e-2 (two units); atol 2e-3 covers outputs near
# 0, where the fp16 rounding of P (<= 2**-11 * sum_j p_j |v_j| ~ 5e-4 here) dominates.
# lse is fp32 computed with exp2/log2 instead of exp/log: a few fp32 units of a value
# ~ log(top-k) + |logit| < 10, so atol = rtol = 1e-5.
OUT_TOL = dict(atol=2e-3, rtol=1.6e-2)
LSE_TOL = dict(atol=1e-5, rtol=1e-5)
# On the GPU, FP8 tensor-core accumulation is not full fp32 (measured LSE errors of 2-6e-3
# absolute at 576-wide dots): a logit error d moves each softmax weight by ~d relatively, so an
# output element moves by up to d times the weighted mean |v| it sums (its magnitude,
# ``sparse_mla_decode_reference_with_magnitude``), whatever its own size: atol 3e-3 + rtol 3e-2
# plus QK_FP8_ACCUMULATION * magnitude. Session 26 (H200, 10 random trials per kernel, 0.5-10M
# elements each): (|error| - half a bf16 ulp) / magnitude at most 1.6-2.0e-3 for the H >= 32
# kernels (Gluon and plain alike); without the magnitude term one element of 524288 failed, 3.7e-3
# off at an output of -9.7e-3 (B=4 q2 H=128, unsplit Gluon). 2^-8 is twice the largest seen.
GPU_OUT_TOL = dict(atol=3e-3, rtol=3e-2)
GPU_LSE_TOL = dict(atol=1.5e-2, rtol=2e-3)
QK_FP8_ACCUMULATION = 2.0 ** -8
# P·V on FP8 tensor cores (the one-warpgroup small-H kernel's default for H <= 16, an option of the
# 8-warp kernel up to 32 heads) carries each softmax weight as hi + lo e4m3 tiles, ~2^-8 relative
# (bf16's precision), so an output element may move by 2^-8 times its magnitude on top of the
# logits' share; 2^-7 in all covers the residuals of weights below e4m3's normal range. The H200
# saw 4.4e-3 at an output of 5.8e-3 (2 of 1M elements outside GPU_OUT_TOL, B=128 q1 H=16,
# bmm1_scale 0.05), and session 26 at most 6.1e-3 times the magnitude (B=128 q1 H=16).
PV_FP8_ROUNDING = 2.0 ** -7


def _scales(device, random_s1: bool = True) -> tuple[float, float]:
    """bmm1_scale, bmm2_scale: random around 1/sqrt(576) and 1 under the interpreter (exact
    products); on the GPU 1/sqrt(576) and 1.25, where GPU_OUT_TOL was measured (a larger scale
    moves the logits, and with them the outputs, further: on the H200 1.5x both put 3 of 98304
    outputs 7.8e-3 off)."""
    if torch.device(device).type == "cuda":
        return 1 / math.sqrt(576), 1.25
    s1 = 1 / math.sqrt(576) * ((0.5 + torch.rand(()).item()) if random_s1 else 1.0)
    return s1, 0.5 + torch.rand(()).item()


def _call(query, kv_cache, block_tables, seq_lens, top_k, **kw):
    return sparse_mla_fp8_decode(query, kv_cache, None, 128, 512, 64, block_tables, seq_lens, 4096,
                                 sparse_mla_top_k=top_k, **kw)


def _make(B, q_len, H, top_k, *, pages=6, page_size=64, four_d=False, device="cpu", gen=None,
          invalid=True, seq_lens="partial"):
    """Random FP8 query/cache and index lists mixing valid rows, duplicates, -1 and
    out-of-range indices; seq_lens with full, partial and zero lengths."""
    gen = gen or torch.Generator().manual_seed(torch.seed() % (1 << 31))
    rows = pages * page_size
    q = (torch.randn(B, q_len, H, 576, generator=gen)).to(FP8)
    kv = (torch.randn(pages, page_size, 576, generator=gen)).to(FP8)
    if four_d:
        kv = kv.view(pages, 1, page_size, 576)
    idx = torch.randint(0, rows, (B, q_len, top_k), generator=gen, dtype=torch.int32)
    if invalid:
        r = torch.rand(B, q_len, top_k, generator=gen)
        idx = torch.where(r < 0.15, -1, idx)
        idx = torch.where((r >= 0.15) & (r < 0.22), rows + torch.randint(0, 1000, idx.shape, generator=gen,
                                                                          dtype=torch.int32), idx)
        idx = torch.where((r >= 0.22) & (r < 0.25), -(2**31) + 5, idx)
        idx[..., 1::7] = idx[..., 0:1]  # duplicates: one row listed in several slots
    if seq_lens == "partial":
        sl = torch.randint(1, top_k + 1, (B,), generator=gen, dtype=torch.int32)
        sl[0] = top_k  # one full row
        if B > 2:
            sl[2] = 0  # one empty batch element
    elif seq_lens == "none":
        sl = None
    else:
        sl = torch.as_tensor(seq_lens, dtype=torch.int32)
    dev = lambda t: None if t is None else t.to(device)
    return dev(q), dev(kv), dev(idx), dev(sl)


def _check(out, lse, q, kv, idx, sl, s1, s2):
    """Against the reference; on the GPU with GPU_OUT_TOL / GPU_LSE_TOL (measured at the scales of
    ``_scales``) plus QK_FP8_ACCUMULATION times each element's magnitude, PV_FP8_ROUNDING for the
    heads that may run an FP8 P·V (H <= 32)."""
    args = (q.cpu(), kv.cpu(), idx.cpu(), None if sl is None else sl.cpu(), s1, s2)
    gpu = out.is_cuda
    tol = dict(GPU_OUT_TOL if gpu else OUT_TOL)
    if gpu:
        ro, rl, magnitude = sparse_mla_decode_reference_with_magnitude(*args)
        per_magnitude = PV_FP8_ROUNDING if q.shape[-2] <= 32 else QK_FP8_ACCUMULATION
        tol["atol"] = tol["atol"] + per_magnitude * magnitude
    else:
        ro, rl = sparse_mla_decode_reference(*args)
    assert_close(out, ro, name="out", **tol)
    assert_close(lse.reshape(rl.shape), rl, name="lse", **(GPU_LSE_TOL if gpu else LSE_TOL))


# ------------------------------------------------------------------ kernel vs reference (CPU)

CASES = [
    # (B, q_len, H, top_k, page_size, four_d, num_splits): small-H (transposed) and
    # H >= 64 kernels, with and without the split + combine step
    (3, 1, 16, 128, 64, False, None),
    (2, 2, 16, 64, 53, True, 1),
    (3, 2, 16, 128, 1, False, 2),
    (3, 1, 20, 128, 64, True, 2),
    (2, 1, 128, 64, 64, False, 1),
    (3, 1, 64, 128, 53, True, 2),
    (1, 2, 48, 64, 1, True, None),
]


@pytest.mark.parametrize("B,q_len,H,top_k,page_size,four_d,num_splits", CASES)
def test_decode_matches_reference(triton_backend, device, B, q_len, H, top_k, page_size, four_d, num_splits):
    q, kv, idx, sl = _make(B, q_len, H, top_k, page_size=page_size, four_d=four_d, device=device)
    md = plan_decode(B, q_len, H, top_k, device, num_splits=num_splits)
    if num_splits is not None:
        assert md.num_splits == num_splits
    s1, s2 = _scales(device)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
    lse = poisoned((B * q_len, H), torch.float32, device)
    res = _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=s1, bmm2_scale=s2, return_lse=True, metadata=md)
    assert res[0] is out and res[1] is lse
    _check(out, lse, q, kv, idx, sl, s1, s2)


@pytest.mark.parametrize("H,kw", [
    (16, dict(transposed=False)),  # the mma.sync small-H kernel, 16-row tiles
    (20, dict(transposed=False, num_splits=2)),
    (16, dict(transposed=False, block_n=32, num_warps=8, num_splits=2)),
    (16, dict(transposed=False, num_stages=3, max_regs=0)),
    # 248 KB of shared memory on sm_90: test_decode_plan_over_shared_memory_raises
    pytest.param(32, dict(transposed=False, block_n=64), marks=interpreter_only),
    (16, dict(block_h=64)),  # small H padded to the 64-head kernel
    (16, dict(prefetch_idx=True)),  # indices loaded one step ahead
    (20, dict(prefetch_idx=True, num_splits=2)),
    (64, dict(prefetch_idx=True)),
    (128, dict(prefetch_idx=True, num_splits=2)),
])
def test_decode_plan_variants(triton_backend, device, H, kw):
    """Every kernel variant a plan can select matches the reference."""
    B, q_len, top_k = 3, 2, 128  # B=3: one empty batch element (seq_lens 0)
    q, kv, idx, sl = _make(B, q_len, H, top_k, page_size=64, four_d=True, device=device)
    md = plan_decode(B, q_len, H, top_k, device, **kw)
    for k, v in kw.items():
        assert getattr(md, k) == v
    s1, s2 = _scales(device, random_s1=False)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
    lse = poisoned((B * q_len, H), torch.float32, device)
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=s1, bmm2_scale=s2, metadata=md)
    _check(out, lse, q, kv, idx, sl, s1, s2)


@pytest.mark.gpu
def test_decode_plan_over_shared_memory_raises():
    """An explicit plan whose kernel needs more shared memory than the GPU has (32 heads on
    the heads-on-M kernel with 64-key tiles: 248 KB on the H200) raises a ValueError naming
    its options, not Triton's out-of-resources error."""
    B, q_len, H, top_k = 2, 1, 32, 128
    q, kv, idx, sl = _make(B, q_len, H, top_k, page_size=64, four_d=True, device="cuda")
    md = plan_decode(B, q_len, H, top_k, "cuda", transposed=False, block_n=64)
    with pytest.raises(ValueError, match=r"block_n=64.*shared memory"):
        _call(q, kv, idx, sl, top_k, bmm1_scale=0.05, metadata=md)


@pytest.mark.parametrize("H", [16, 64])
def test_decode_fp32_partials(triton_backend, device, H):
    """The split path with fp32 scratch (the fp16 default is covered by CASES)."""
    B, q_len, top_k = 2, 1, 128
    q, kv, idx, sl = _make(B, q_len, H, top_k, page_size=53, device=device)
    md = plan_decode(B, q_len, H, top_k, device, num_splits=2, partial_dtype=torch.float32)
    assert md.num_splits == 2 and md.partial_o.dtype == torch.float32
    s1 = 1 / math.sqrt(576)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
    lse = poisoned((B * q_len, H), torch.float32, device)
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=s1, bmm2_scale=0.75, metadata=md)
    _check(out, lse, q, kv, idx, sl, s1, 0.75)


def test_decode_seq_lens_none_and_allocated_outputs(triton_backend, device):
    B, q_len, H, top_k = 2, 1, 16, 128
    q, kv, idx, _ = _make(B, q_len, H, top_k, device=device)
    out, lse = _call(q, kv, idx, None, top_k, bmm1_scale=0.05, return_lse=True)
    assert out.shape == (B, q_len, H, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (B, q_len, H) and lse.dtype == torch.float32
    _check(out, lse, q, kv, idx, None, 0.05, 1.0)
    # without return_lse only out comes back (the LSE goes to the metadata's scratch)
    out2 = _call(q, kv, idx, None, top_k, bmm1_scale=0.05)
    assert isinstance(out2, torch.Tensor)
    assert_equal(out2, out)


@pytest.mark.parametrize("num_splits,H,dtype", [(2, 16, torch.float16), (3, 20, torch.float32),
                                                 (8, 128, torch.float16), (32, 16, torch.float16)])
def test_combine_matches_reference(triton_backend, device, num_splits, H, dtype):
    """The split combine against the LSE-weighted merge in float64: split counts that are and
    are not powers of two (the tiling narrows the value columns as they grow), empty splits
    (lse -inf) whose partial outputs are NaN and must not be read into the result, and a
    row whose splits are all empty (out 0, lse +inf)."""
    from mate.ops.sparse_mla.decode import launch_combine

    rows = 3
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    po = torch.randn(rows, num_splits, H, 512, generator=g).to(dtype)
    plse = torch.randn(rows, num_splits, H, generator=g) * 4
    empty = torch.rand(rows, num_splits, H, generator=g) < 0.3
    empty[2] = True
    plse[empty] = float("-inf")
    po[empty] = float("nan")
    po, plse = po.to(device), plse.to(device)
    out = poisoned((rows, H, 512), torch.bfloat16, device)
    lse = poisoned((rows, H), torch.float32, device)
    launch_combine(po, plse, out, lse, 0.75, H, num_splits, rows)

    lse64 = plse.double().cpu()
    m = lse64.amax(dim=1, keepdim=True)
    w = torch.exp(lse64 - torch.where(torch.isinf(m), 0.0, m))
    total = w.sum(dim=1)
    merged = (w[..., None] * torch.nan_to_num(po.double().cpu())).sum(dim=1)
    all_empty = total == 0
    want = torch.where(all_empty[..., None], 0.0, merged / total.clamp_min(1e-300)[..., None] * 0.75)
    want_lse = torch.where(all_empty, float("inf"), torch.log(total) + m[:, 0])
    assert_close(out, want, atol=1e-2, rtol=1e-2)  # bf16 output
    assert_close(lse, want_lse.float(), atol=1e-5, rtol=1e-5, name="lse")
    assert bool(all_empty[2].all())


def test_decode_empty_rows(triton_backend, device):
    """All slots invalid (-1, out of range, or seq_lens 0): out 0, lse +inf."""
    B, q_len, H, top_k = 3, 1, 16, 64
    q, kv, idx, _ = _make(B, q_len, H, top_k, device=device, invalid=False)
    idx[0] = -1
    idx[1] = kv.shape[0] * kv.shape[-2] + 3  # first row past the cache
    sl = torch.tensor([top_k, top_k, 0], dtype=torch.int32, device=device)
    for splits in (1, 2):
        md = plan_decode(B, q_len, H, top_k, device, num_splits=min(splits, top_k // 64))
        out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
        lse = poisoned((B, q_len, H), torch.float32, device)
        _call(q, kv, idx, sl, top_k, out=out, lse=lse, metadata=md)
        assert_equal(out, torch.zeros_like(out))
        assert_equal(lse, torch.full_like(lse, float("inf")))


def test_decode_empty_cache_and_zero_batch(triton_backend, device):
    top_k = 64
    q, _, idx, sl = _make(2, 1, 16, top_k, device=device)
    kv = torch.empty(0, 64, 576, dtype=FP8, device=device)
    out, lse = _call(q, kv, idx, sl, top_k, return_lse=True)
    assert_equal(out, torch.zeros_like(out))
    assert_equal(lse, torch.full_like(lse, float("inf")))
    q0 = torch.empty(0, 1, 16, 576, dtype=FP8, device=device)
    idx0 = torch.empty(0, 1, top_k, dtype=torch.int32, device=device)
    out0, lse0 = _call(q0, torch.zeros(2, 64, 576, device=device).to(FP8), idx0, None, top_k, return_lse=True)
    assert out0.shape == (0, 1, 16, 512) and lse0.shape == (0, 1, 16)


def test_metadata_reuse_across_seq_lens(triton_backend, device):
    """One metadata object (public planner) stays valid while seq_lens values change."""
    B, q_len, H, top_k = 2, 2, 16, 128
    q, kv, idx, sl = _make(B, q_len, H, top_k, device=device)
    md = get_batch_decode_metadata_mla(q, sl, top_k)
    assert isinstance(md, DecodeMetadata)
    assert md.config == (B, q_len, H, top_k, q.device)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
    lse = poisoned((B, q_len, H), torch.float32, device)
    for lens in ([top_k, 5], [0, 70], [64, top_k]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=0.04, metadata=md)
        _check(out, lse, q, kv, idx, sl, 0.04, 1.0)


def test_metadata_mismatch_raises(triton_backend, device):
    B, q_len, H, top_k = 2, 1, 16, 64
    q, kv, idx, sl = _make(B, q_len, H, top_k, device=device)
    for other in (plan_decode(B + 1, q_len, H, top_k, device), plan_decode(B, 2, H, top_k, device),
                  plan_decode(B, q_len, 32, top_k, device), plan_decode(B, q_len, H, 128, device)):
        with pytest.raises(ValueError, match="metadata"):
            _call(q, kv, idx, sl, top_k, metadata=other)
    with pytest.raises(TypeError, match="metadata"):
        _call(q, kv, idx, sl, top_k, metadata={"B": B})


def test_reference_backend_on_cpu(reference_backend):
    """The default CPU path (the reference behind the custom op) fills the same buffers."""
    B, q_len, H, top_k = 2, 2, 16, 64
    q, kv, idx, sl = _make(B, q_len, H, top_k)
    out = poisoned((B, q_len, H, 512), torch.bfloat16)
    lse = poisoned((B * q_len, H), torch.float32)
    res = _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=0.05, bmm2_scale=2.0, return_lse=True)
    assert res[0] is out and res[1] is lse
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sl, 0.05, 2.0)
    assert_equal(out, ro)
    assert_equal(lse, rl.view(B * q_len, H))


def test_custom_op_opcheck(reference_backend):
    B, q_len, H, top_k = 1, 1, 16, 64
    q, kv, idx, sl = _make(B, q_len, H, top_k)
    md = plan_decode(B, q_len, H, top_k, "cpu", num_splits=1)
    out = torch.empty(B, q_len, H, 512, dtype=torch.bfloat16)
    lse = torch.empty(B, q_len, H)
    args = (q, kv.view(-1, 576), idx, sl, out, lse, md.partial_o, md.partial_lse, 0.05, 1.0, md.block_h,
            md.num_splits, md.split_blocks, md.num_warps, md.num_stages, md.block_n, md.transposed,
            md.max_regs, md.prefetch_idx)
    # test_schema is left out: its aliasing check multiplies the inputs, which torch's CPU
    # kernels do not implement for float8_e4m3fn.
    torch.library.opcheck(torch.ops.mate.sparse_mla_fp8_decode.default, args,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph(reference_backend):
    """The public call traces into one graph (the custom op's fake implementation)."""
    B, q_len, H, top_k = 1, 1, 16, 64
    q, kv, idx, sl = _make(B, q_len, H, top_k)
    md = plan_decode(B, q_len, H, top_k, "cpu")

    def step(q, kv, idx, sl, out, lse):
        return sparse_mla_fp8_decode(q, kv, None, 128, 512, 64, idx, sl, 0, top_k, out=out, lse=lse,
                                     bmm1_scale=0.05, metadata=md)

    out = poisoned((B, q_len, H, 512), torch.bfloat16)
    lse = poisoned((B, q_len, H), torch.float32)
    res = torch.compile(step, backend="aot_eager", fullgraph=True)(q, kv, idx, sl, out, lse)
    assert res is out
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sl, 0.05, 1.0)
    assert_equal(out, ro)
    assert_equal(lse, rl)


# ------------------------------------------------------------------ validation

def _bad_cases():
    B, q_len, H, top_k = 2, 1, 16, 64
    q, kv, idx, sl = _make(B, q_len, H, top_k)
    base = dict(query=q, kv_cache=kv, workspace_buffer=None, qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=idx, seq_lens=sl, max_seq_len=4096, sparse_mla_top_k=top_k)
    return base, [
        (dict(query=q.to(torch.bfloat16)), TypeError, "query must be torch.float8_e4m3fn"),
        (dict(query=q[:, :, :, :512]), ValueError, "query"),
        (dict(query=torch.zeros(B, q_len, H, 1152).to(FP8)[..., :576]), ValueError, "query must be contiguous"),
        (dict(kv_cache=kv.float()), TypeError, "kv_cache"),
        (dict(kv_cache=kv[..., :512].contiguous()), ValueError, "kv_cache"),
        (dict(kv_cache=kv.view(6, 2, 32, 576)), ValueError, "kv_cache"),
        (dict(block_tables=idx.long()), TypeError, "block_tables"),
        (dict(block_tables=idx[:1]), ValueError, "block_tables"),
        (dict(block_tables=idx.transpose(0, 2).contiguous().transpose(0, 2)), ValueError, "block_tables"),
        (dict(sparse_mla_top_k=0), ValueError, "sparse_mla_top_k"),
        (dict(sparse_mla_top_k=96), ValueError, "sparse_mla_top_k"),
        (dict(sparse_mla_top_k=128), ValueError, "sparse_mla_top_k"),
        (dict(sparse_mla_top_k=64.0), TypeError, "sparse_mla_top_k"),
        (dict(seq_lens=sl.long()), TypeError, "seq_lens"),
        (dict(seq_lens=sl[:1]), ValueError, "seq_lens"),
        (dict(kv_lora_rank=256), ValueError, "kv_lora_rank"),
        (dict(qk_rope_head_dim=128), ValueError, "qk_rope_head_dim"),
        (dict(bmm1_scale=torch.tensor(1.0)), NotImplementedError, "bmm1_scale"),
        (dict(bmm2_scale=torch.tensor(1.0)), NotImplementedError, "bmm2_scale"),
        (dict(bmm1_scale="1"), TypeError, "bmm1_scale"),
        (dict(sinks=[torch.zeros(16)]), NotImplementedError, "sinks"),
        (dict(skip_softmax_threshold_scale_factor=0.5), NotImplementedError, "skip_softmax_threshold"),
        (dict(uses_shared_paged_kv_idx=False), NotImplementedError, "uses_shared_paged_kv_idx"),
        (dict(cum_seq_lens_q=torch.zeros(3, dtype=torch.int32)), NotImplementedError, "cum_seq_lens_q"),
        (dict(max_q_len=1), NotImplementedError, "max_q_len"),
        (dict(out=torch.empty(B, q_len, H, 512)), TypeError, "out"),
        (dict(out=torch.empty(B, q_len, H, 576, dtype=torch.bfloat16)), ValueError, "out"),
        (dict(out=torch.empty(B, q_len, H, 1024, dtype=torch.bfloat16)[..., ::2]), ValueError, "out"),
        (dict(lse=torch.empty(B, q_len, H, dtype=torch.float16)), TypeError, "lse"),
        (dict(lse=torch.empty(B * q_len, H + 1)), ValueError, "lse"),
        (dict(lse=torch.empty(B, q_len, H, 1)), ValueError, "lse"),
        (dict(lse=torch.empty(B * q_len, 2 * H)[:, ::2]), ValueError, "lse"),
        (dict(return_lse=1), TypeError, "return_lse"),
        (dict(kv_cache=kv.to("meta")), ValueError, "kv_cache must be on cpu"),
        (dict(block_tables=idx.to("meta")), ValueError, "block_tables must be on cpu"),
        (dict(seq_lens=sl.repeat(2)[::2]), ValueError, "seq_lens must be contiguous"),
        (dict(out=[0.0]), TypeError, "out must be a torch.Tensor, got list"),
        (dict(lse=[0.0]), TypeError, "lse must be a torch.Tensor, got list"),
        (dict(seq_lens=[1, 1]), TypeError, "seq_lens must be a torch.Tensor, got list"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases()[1])))
def test_decode_bad_inputs(case):
    base, cases = _bad_cases()
    change, exc, match = cases[case]
    with pytest.raises(exc, match=match):
        sparse_mla_fp8_decode(**{**base, **change})


def test_decode_ignored_compatibility_arguments(reference_backend):
    base, _ = _bad_cases()
    ref = sparse_mla_fp8_decode(**base)
    out = sparse_mla_fp8_decode(**base, enable_pdl=True, backend="trtllm-gen", is_var_seq=False,
                                cute_dsl_impl="x", kv_scale_format="y",
                                multi_ctas_kv_counter_buffer=torch.zeros(4, dtype=torch.int32))
    assert_equal(out, ref)


def test_metadata_bad_inputs():
    q, _, _, sl = _make(2, 1, 16, 64)
    with pytest.raises(TypeError, match="query"):
        get_batch_decode_metadata_mla(q.float(), sl, 64)
    with pytest.raises(ValueError, match="query"):
        get_batch_decode_metadata_mla(q[..., :64], sl, 64)
    with pytest.raises(ValueError, match="sparse_mla_top_k"):
        get_batch_decode_metadata_mla(q, sl, 100)
    with pytest.raises(TypeError, match="sparse_mla_top_k"):
        get_batch_decode_metadata_mla(q, sl, "64")
    with pytest.raises(TypeError, match="seq_lens"):
        get_batch_decode_metadata_mla(q, sl.float(), 64)
    with pytest.raises(ValueError, match="seq_lens"):
        get_batch_decode_metadata_mla(q, sl[:1], 64)
    too_many = r"query must be at most 65535 rows B \* q_len per call, got 'B=65536, q_len=1'"
    with pytest.raises(ValueError, match=too_many):
        get_batch_decode_metadata_mla(torch.empty(65536, 1, 1, 576, dtype=torch.float8_e4m3fn),
                                      torch.ones(65536, dtype=torch.int32), 64)
    md = get_batch_decode_metadata_mla(q, sl.view(2, 1), 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        md.num_splits = 3


def test_plan_is_value_independent_and_splits_fill_the_gpu():
    """The schedule depends on shapes only; small batches split the top-k list."""
    p1 = plan_decode(8, 1, 128, 2048, "cpu", num_sms=132)
    assert p1.num_splits > 1 and p1.num_splits * p1.num_head_tiles * 8 <= 2 * 132
    p2 = plan_decode(64, 1, 128, 2048, "cpu", num_sms=132)
    assert p2.num_splits == 1  # 128 programs already fill 132 SMs
    p3 = plan_decode(1, 1, 16, 2048, "cpu", num_sms=132)
    assert p3.transposed and p3.block_h == 16 and p3.block_n == 64 and p3.num_splits == 32
    assert p3.split_blocks * p3.block_n == 64  # at least 64 slots per split on the CPU
    assert p3.partial_o.shape == (1, 32, 16, 512) and p3.partial_lse.shape == (1, 32, 16)
    assert plan_decode(128, 1, 16, 2048, "cpu", num_sms=132).num_splits == 1  # 128 programs, 1 per SM
    p4 = plan_decode(128, 1, 16, 2048, "cpu", num_sms=132, transposed=False)
    assert p4.block_n == 16 and p4.max_regs == 128 and p4.num_splits == 4  # 4 per SM, 512 slots each
    assert p3.partial_o.dtype == torch.float16 and p3.partial_lse.dtype == torch.float32
    assert plan_decode(2, 2, 64, 64, "cpu").partial_o.numel() == 0
    with pytest.raises(ValueError, match="block_h"):
        plan_decode(2, 1, 16, 64, "cpu", block_h=8)
    with pytest.raises(ValueError, match="block_n"):
        plan_decode(2, 1, 16, 64, "cpu", block_n=8)
    with pytest.raises(ValueError, match="block_n"):
        plan_decode(2, 1, 64, 64, "cpu", block_n=16)
    with pytest.raises(ValueError, match="transposed"):
        plan_decode(2, 1, 64, 64, "cpu", transposed=True)
    with pytest.raises(ValueError, match="partial_dtype"):
        plan_decode(2, 1, 16, 64, "cpu", partial_dtype=torch.bfloat16)


# ------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("H", [16, 32, 64, 128])
@pytest.mark.parametrize("B,q_len,top_k", [(1, 1, 2112), (8, 2, 2048), (64, 1, 2048), (3, 2, 2112), (32, 1, 2048)])
def test_gpu_decode_shapes(H, B, q_len, top_k):
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, four_d=H == 32, device="cuda")
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    s1 = 1 / math.sqrt(576)
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=s1, bmm2_scale=1.25)
    _check(out, lse, q, kv, idx, sl, s1, 1.25)


@gpu
@pytest.mark.parametrize("H,kw", [(16, dict(prefetch_idx=True)), (128, dict(prefetch_idx=True)),
                                  (16, dict(transposed=False)), (32, dict(transposed=False))])
def test_gpu_plan_variants(H, kw):
    """The optional kernel variants of a plan at top-k 2048 (B=8: split + combine)."""
    B, q_len, top_k = 8, 1, 2048
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    md = plan_decode(B, q_len, H, top_k, "cuda", **kw)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    s1 = 1 / math.sqrt(576)
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=s1, bmm2_scale=1.25, metadata=md)
    _check(out, lse, q, kv, idx, sl, s1, 1.25)


def check_graph_replay(B, q_len, H, top_k, md, *, bmm1_scale=0.05):
    """A decode with prepared metadata allocates nothing after its first call; captured in
    a CUDA graph and replayed on new contents of the captured buffers, it matches the
    reference and, bit for bit, an eager call with the same metadata."""
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    out = torch.empty(B, q_len, H, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, q_len, H, device="cuda")
    run = lambda: _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=bmm1_scale, metadata=md)
    run()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    graph = capture_graph(run)
    for _ in range(2):  # new contents in the captured buffers
        for dst, src in zip((q, kv, idx, sl), _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, q, kv, idx, sl, bmm1_scale, 1.0)
        eager_out = poisoned(out.shape, torch.bfloat16, "cuda")
        eager_lse = poisoned(lse.shape, torch.float32, "cuda")
        _call(q, kv, idx, sl, top_k, out=eager_out, lse=eager_lse, bmm1_scale=bmm1_scale, metadata=md)
        assert_equal(out, eager_out)
        assert_equal(lse, eager_lse)


def count_unequal_repeats(B, q_len, H, top_k, md, repeats):
    """How many of ``repeats`` decodes with the same inputs and metadata differ (in any bit
    of out or lse) from the first one."""
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    first, first_lse = _call(q, kv, idx, sl, top_k, bmm1_scale=0.05, return_lse=True, metadata=md)
    out, lse = torch.empty_like(first), torch.empty_like(first_lse)
    mismatches = 0
    for _ in range(repeats):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=0.05, metadata=md)
        mismatches += not (torch.equal(out, first) and torch.equal(lse, first_lse))
    return mismatches


@gpu
# (32, 1, 128): Gluon with 2 splits; (128, 1, 16): the dual one-warpgroup kernel (FP8 P·V)
@pytest.mark.parametrize("B,q_len,H", [(4, 2, 16), (4, 2, 128), (32, 1, 128), (128, 1, 16)])
def test_gpu_cuda_graph_replay_and_no_allocation(B, q_len, H):
    top_k = 2048
    q, _, _, sl = _make(B, q_len, H, top_k, pages=1, device="cuda")
    check_graph_replay(B, q_len, H, top_k, get_batch_decode_metadata_mla(q, sl, top_k))


@gpu
@pytest.mark.parametrize("B,H", [(8, 128), (128, 16)])
def test_gpu_repeated_decodes_bit_identical(B, H):
    """1,000 decodes with one metadata object give the same bits: B=8 H=128 splits (the combine
    step), B=128 H=16 the dual one-warpgroup kernel with its FP8 P·V (two chains merged in
    shared memory)."""
    q, _, _, sl = _make(B, 1, H, 2048, pages=1, device="cuda")
    md = get_batch_decode_metadata_mla(q, sl, 2048)
    assert md.num_splits > 1 if H == 128 else md.chains == 2
    assert count_unequal_repeats(B, 1, H, 2048, md, 1000) == 0
