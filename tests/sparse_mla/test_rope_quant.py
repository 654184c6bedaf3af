"""``mla_rope_quantize_fp8``: the Triton kernel against the reference, layouts, edge cases, errors.

CPU: the kernel runs under Triton's interpreter, where every step is the same fp32
arithmetic as the reference (no FMA contraction, exact software FP8 rounding), so outputs
are compared bit for bit. GPU: the latent parts are one multiply and one rounding (bit
exact); the rotary parts may be contracted into FMAs, which moves the fp32 value by one
fp32 ulp and can flip the FP8 rounding by one e4m3 unit (2**-3 relative), so those are
compared within one e4m3 unit.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.sparse_mla.reference import mla_rope_quantize_fp8_reference
from mate.sparse_mla_interface import mla_rope_quantize_fp8
from mate.testing import assert_close, assert_equal, poisoned

E4M3 = torch.float8_e4m3fn
NAMES = ("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")


def _inputs(nnz, H, device, *, max_seq=64, cache_dtype=torch.float32, pos_dtype=torch.int64, amp=1.0):
    # amp > 1 pushes part of the values past 448 (saturation)
    q_rope = (torch.randn(nnz, H, 64, device=device) * amp).bfloat16()
    k_rope = (torch.randn(nnz, 64, device=device) * amp).bfloat16()
    q_nope = (torch.randn(nnz, H, 512, device=device) * amp).bfloat16()
    k_nope = (torch.randn(nnz, 512, device=device) * amp).bfloat16()
    theta = torch.rand(max_seq, 32, device=device) * 6.3
    cache = torch.cat([theta.cos(), theta.sin()], dim=1).to(cache_dtype)
    pos = torch.randint(0, max_seq, (nnz,), device=device, dtype=pos_dtype)
    return [q_rope, k_rope, q_nope, k_nope, cache, pos]


def _reference(args, is_neox, sq, skv):
    q_rope, k_rope, q_nope, k_nope = args[:4]
    outs = [torch.empty(t.shape, dtype=E4M3, device=t.device) for t in (q_rope, k_rope, q_nope, k_nope)]
    mla_rope_quantize_fp8_reference(*args, is_neox, sq, skv, *outs)
    return outs


def _check(outs, refs, device):
    for name, o, r in zip(NAMES, outs, refs):
        if device == "cpu" or "nope" in name:
            assert_equal(o, r, name=name)
        else:
            # FMA contraction on the GPU: at most one e4m3 unit (rtol 2**-3) or one subnormal step
            assert_close(o, r, rtol=0.13, atol=2.0**-9, name=name)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_matches_reference(device, triton_backend, is_neox, cache_dtype, pos_dtype):
    nnz, H = 3, 11  # two head blocks, the second one partial
    args = _inputs(nnz, H, device, cache_dtype=cache_dtype, pos_dtype=pos_dtype, amp=150.0)
    sq, skv = 1.7, 0.37
    outs = [poisoned(t.shape, E4M3, device) for t in args[:4]]
    got = mla_rope_quantize_fp8(*args, is_neox=is_neox, quant_scale_q=sq, quant_scale_kv=skv,
                                q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])
    assert all(g is o for g, o in zip(got, outs))
    _check(outs, _reference(args, is_neox, sq, skv), device)
    # saturation happened and kept +-448 (amp 150 * scale 1.7 exceeds 448 often)
    assert (outs[2].float().abs() == 448).any()
    assert torch.isfinite(torch.cat([o.float().flatten() for o in outs])).all()


@pytest.mark.parametrize("H", [1, 3, 72])  # 72: the 16-head blocks of large H, the last one partial
def test_small_and_odd_heads_allocated_outputs(device, triton_backend, H):
    args = _inputs(4 if H < 64 else 1, H, device, pos_dtype=torch.int32)
    got = mla_rope_quantize_fp8(*args, is_neox=False, quant_scale_q=0.5, quant_scale_kv=2.0)
    for g, t in zip(got, args[:4]):
        assert g.dtype == E4M3 and g.shape == t.shape and g.device == t.device
    _check(got, _reference(args, False, 0.5, 2.0), device)


def test_merged_rows_strided_inputs_and_outputs(device, triton_backend):
    nnz, H, pad = 5, 9, 16
    # inputs: slices of merged bf16 rows (strided leading dims)
    q_bf = torch.randn(nnz, H, 576 + 8, device=device).bfloat16() * 8
    k_bf = torch.randn(nnz, 576 + 8, device=device).bfloat16() * 8
    args = _inputs(nnz, H, device, cache_dtype=torch.bfloat16)
    args[:4] = [q_bf[..., 512:576], k_bf[:, 512:576], q_bf[..., :512], k_bf[:, :512]]
    # outputs: head-major merged query [H, nnz, 576 + pad] viewed token-major, and KV-cache rows
    q_fp8 = poisoned((H, nnz, 576 + pad), E4M3, device)
    q_view = q_fp8.transpose(0, 1)  # [nnz, H, 576 + pad], strides (576 + pad, nnz * (576 + pad), 1)
    cache_rows = poisoned((2 * nnz, 576 + pad), E4M3, device)
    kv_view = cache_rows[1::2]  # every other row of the cache
    sq, skv = 3.0, 0.25
    got = mla_rope_quantize_fp8(*args, quant_scale_q=sq, quant_scale_kv=skv,
                                q_rope_out=q_view[..., 512:576], q_nope_out=q_view[..., :512],
                                k_rope_out=kv_view[:, 512:576], k_nope_out=kv_view[:, :512])
    assert got[0].data_ptr() == q_view[..., 512:].data_ptr()
    refs = _reference(args, True, sq, skv)
    _check([q_view[..., 512:576], kv_view[:, 512:576], q_view[..., :512], kv_view[:, :512]], refs, device)
    # nothing written outside the slices: the padding and the skipped cache rows keep their NaN
    assert q_fp8[..., 576:].view(torch.uint8).eq(0x7F).all()
    assert cache_rows[0::2].view(torch.uint8).eq(0x7F).all()
    assert cache_rows[1::2, 576:].view(torch.uint8).eq(0x7F).all()


def test_nan_and_saturation_values(device, triton_backend):
    args = _inputs(2, 2, device)
    args[2][0, 0, :5] = torch.tensor([1e4, -1e4, 449.0, float("nan"), -0.0])
    args[3][1, :2] = torch.tensor([float("inf"), float("-inf")])
    outs = mla_rope_quantize_fp8(*args)
    _check(outs, _reference(args, True, 1.0, 1.0), device)
    v = outs[2][0, 0, :5].float()
    assert v[:3].tolist() == [448.0, -448.0, 448.0] and torch.isnan(v[3])
    assert outs[3][1, :2].float().tolist() == [448.0, -448.0]


def test_nnz_zero_is_noop(device, triton_backend):
    args = _inputs(0, 4, device)
    outs = [torch.empty(t.shape, dtype=E4M3, device=device) for t in args[:4]]
    got = mla_rope_quantize_fp8(*args, q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2],
                                k_nope_out=outs[3])
    assert all(g is o for g, o in zip(got, outs))
    got = mla_rope_quantize_fp8(*args)
    assert [tuple(g.shape) for g in got] == [(0, 4, 64), (0, 64), (0, 4, 512), (0, 512)]


def test_out_of_range_positions_clamped_and_checked(device, triton_backend, monkeypatch):
    args = _inputs(4, 2, device, max_seq=8)
    args[5][1], args[5][2] = 8, -3  # out of range: never read outside the cache
    outs = mla_rope_quantize_fp8(*args)
    refs = _reference(args, True, 1.0, 1.0)  # the reference clamps the same way
    _check(outs, refs, device)
    monkeypatch.setenv("MATE_CHECK_INPUTS", "1")
    with pytest.raises(ValueError, match=r"pos_ids must be in \[0, 8\).*\[-3, 8\]"):
        mla_rope_quantize_fp8(*args)
    args[5][1], args[5][2] = 7, 0
    mla_rope_quantize_fp8(*args)  # in range: no error with the check on


@pytest.mark.parametrize("config", [(1, 1), (4, 2), (16, 8)])
def test_launch_configs_match_reference(device, config):
    from mate.ops.sparse_mla.rope_quant import mla_rope_quantize_fp8_triton

    args = _inputs(2, 19, device, amp=200.0)
    outs = [poisoned(t.shape, E4M3, device) for t in args[:4]]
    mla_rope_quantize_fp8_triton(*args, False, 1.5, 0.5, *outs, config=config)
    _check(outs, _reference(args, False, 1.5, 0.5), device)


def test_reference_backend_same_results(device, reference_backend):
    args = _inputs(3, 5, device, pos_dtype=torch.int32)
    outs = mla_rope_quantize_fp8(*args, is_neox=False, quant_scale_q=2.0, quant_scale_kv=0.5)
    for name, o, r in zip(NAMES, outs, _reference(args, False, 2.0, 0.5)):
        assert_equal(o, r, name=name)


# --------------------------------------------------------------------------- validation


def _bad(name):
    """Cases: (description, mutate(args, kwargs), exception, message regex)."""
    bf = torch.bfloat16

    def set_arg(i, fn):
        def mutate(a, k):
            a[i] = fn(a[i])

        return mutate

    def set_kw(key, fn):
        def mutate(a, k):
            k[key] = fn(a)

        return mutate

    cases = {
        "q_rope dtype": (set_arg(0, lambda t: t.float()), TypeError,
                         r"q_rope must be torch.bfloat16, got torch.float32"),
        "k_rope dtype": (set_arg(1, lambda t: t.half()), TypeError, r"k_rope must be torch.bfloat16"),
        "q_nope dtype": (set_arg(2, lambda t: t.float()), TypeError, r"q_nope must be torch.bfloat16"),
        "k_nope dtype": (set_arg(3, lambda t: t.float()), TypeError, r"k_nope must be torch.bfloat16"),
        "cache dtype": (set_arg(4, lambda t: t.half()), TypeError, r"cos_sin_cache must be one of"),
        "pos dtype": (set_arg(5, lambda t: t.float()), TypeError, r"pos_ids must be one of \(torch.int32"),
        "q_rope not tensor": (set_arg(0, lambda t: t.tolist()), TypeError, r"q_rope must be a torch.Tensor"),
        "q_rope ndim": (set_arg(0, lambda t: t[:, 0]), ValueError, r"q_rope must be 3-D, got 2-D"),
        "q_rope width": (set_arg(0, lambda t: t[..., :32]), ValueError, r"q_rope must have shape \[3, 2, 64\]"),
        "no heads": (lambda a, k: [a.__setitem__(0, a[0][:, :0]), a.__setitem__(2, a[2][:, :0])], ValueError,
                     r"q_rope must be \[nnz, H, 64\] with H >= 1, got \[3, 0, 64\]"),
        "k_rope nnz": (set_arg(1, lambda t: t[:2]), ValueError, r"k_rope must have shape \[3, 64\], got \[2, 64\]"),
        "q_nope heads": (set_arg(2, lambda t: t[:, :1]), ValueError, r"q_nope must have shape \[3, 2, 512\]"),
        "k_nope width": (set_arg(3, lambda t: t[:, :256]), ValueError, r"k_nope must have shape \[3, 512\]"),
        "cache width": (set_arg(4, lambda t: t[:, :32].contiguous()), ValueError, r"cos_sin_cache must have shape"),
        "cache strided": (set_arg(4, lambda t: t[::2]), ValueError, r"cos_sin_cache must be contiguous"),
        "cache empty": (set_arg(4, lambda t: t[:0]), ValueError, r"cos_sin_cache must be at least one row"),
        "pos shape": (set_arg(5, lambda t: t[:2]), ValueError, r"pos_ids must have shape \[3\], got \[2\]"),
        "pos strided": (set_arg(5, lambda t: t.repeat(2)[::2]), ValueError, r"pos_ids must be contiguous"),
        "q_rope last dim": (set_arg(0, lambda t: t.transpose(0, 2).contiguous().transpose(0, 2)), ValueError,
                            r"q_rope must have a contiguous last dimension"),
        "k_nope last dim": (set_arg(3, lambda t: t.t().contiguous().t()), ValueError,
                            r"k_nope must have a contiguous last dimension"),
        "is_neox type": (set_kw("is_neox", lambda a: 1), TypeError, r"is_neox must be a bool, got int"),
        "scale tensor": (set_kw("quant_scale_q", lambda a: torch.tensor(2.0)), NotImplementedError,
                         r"quant_scale_q must be a Python float"),
        "scale type": (set_kw("quant_scale_kv", lambda a: "1"), TypeError, r"quant_scale_kv must be a float, got str"),
        "quantize_dtype e5m2": (set_kw("quantize_dtype", lambda a: torch.float8_e5m2), ValueError,
                                r"quantize_dtype must be torch.float8_e4m3fn.*got torch.float8_e5m2"),
        "quantize_dtype bf16": (set_kw("quantize_dtype", lambda a: bf), ValueError, r"quantize_dtype must be"),
        "quantize_dtype type": (set_kw("quantize_dtype", lambda a: "fp8"), TypeError,
                                r"quantize_dtype must be a torch.dtype or None, got str"),
        "out e5m2 implied": (set_kw("k_nope_out", lambda a: torch.empty(3, 512, dtype=torch.float8_e5m2)),
                             ValueError, r"k_nope_out must be torch.float8_e4m3fn.*got torch.float8_e5m2"),
        "out e5m2 vs quantize_dtype": (
            lambda a, k: k.update(quantize_dtype=E4M3, q_rope_out=torch.empty(3, 2, 64, dtype=torch.float8_e5m2)),
            ValueError, r"q_rope_out must be torch.float8_e4m3fn \(quantize_dtype\), got torch.float8_e5m2"),
        "out not fp8": (set_kw("q_nope_out", lambda a: torch.empty(3, 2, 512, dtype=bf)), TypeError,
                        r"q_nope_out must be an FP8 tensor.*got torch.bfloat16"),
        "outs mixed fp8": (
            lambda a, k: k.update(q_rope_out=torch.empty(3, 2, 64, dtype=E4M3),
                                  k_rope_out=torch.empty(3, 64, dtype=torch.float8_e5m2)),
            TypeError, r"k_rope_out must have the dtype of q_rope_out \(torch.float8_e4m3fn\), got torch.float8_e5m2"),
        "out shape": (set_kw("k_rope_out", lambda a: torch.empty(3, 32, dtype=E4M3)), ValueError,
                      r"k_rope_out must have shape \[3, 64\], got \[3, 32\]"),
        "out last dim": (set_kw("q_rope_out", lambda a: torch.empty(3, 64, 2, dtype=E4M3).transpose(1, 2)),
                         ValueError, r"q_rope_out must have a contiguous last dimension"),
        "out device": (set_kw("q_nope_out", lambda a: torch.empty(3, 2, 512, dtype=E4M3, device="meta")),
                       ValueError, r"q_nope_out must be on"),
        "pos device": (set_arg(5, lambda t: t.to("meta")), ValueError, r"pos_ids must be on cpu"),
    }
    return cases[name]


BAD_CASES = [
    "q_rope dtype", "k_rope dtype", "q_nope dtype", "k_nope dtype", "cache dtype", "pos dtype", "q_rope not tensor",
    "q_rope ndim", "q_rope width", "no heads", "k_rope nnz", "q_nope heads", "k_nope width", "cache width",
    "cache strided", "cache empty", "pos shape", "pos strided", "q_rope last dim", "k_nope last dim", "is_neox type",
    "scale tensor", "scale type", "quantize_dtype e5m2", "quantize_dtype bf16", "quantize_dtype type",
    "out e5m2 implied", "out e5m2 vs quantize_dtype", "out not fp8", "outs mixed fp8", "out shape", "out last dim",
    "out device", "pos device",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_inputs_raise(case):
    mutate, exc, match = _bad(case)
    args = _inputs(3, 2, "cpu", max_seq=16)
    kwargs = {}
    mutate(args, kwargs)
    with pytest.raises(exc, match=match):
        mla_rope_quantize_fp8(*args, **kwargs)


def test_quantize_dtype_inferred_from_first_buffer_and_default():
    args = _inputs(2, 2, "cpu")
    out = torch.empty(2, 64, dtype=E4M3)
    got = mla_rope_quantize_fp8(*args, k_rope_out=out, enable_pdl=True)  # enable_pdl: ignored
    assert got[1] is out and all(g.dtype == E4M3 for g in got)
    got = mla_rope_quantize_fp8(*args, quantize_dtype=E4M3)
    assert all(g.dtype == E4M3 for g in got)


# --------------------------------------------------------------------------- custom op


def test_opcheck(device, triton_backend):
    args = _inputs(2, 3, device, pos_dtype=torch.int32)
    outs = [torch.empty(t.shape, dtype=E4M3, device=device) for t in args[:4]]
    # fake-tensor and functionalization (AOT dispatch) checks. "test_schema" cannot run on FP8
    # buffers: it compares them with torch.allclose, which torch does not implement for e4m3
    # on the CPU; the mutation it would check is covered by the compile test below.
    torch.library.opcheck(torch.ops.mate.mla_rope_quantize_fp8.default, (*args, True, 1.5, 0.5, *outs),
                          test_utils=("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))


def test_torch_compile_cpu(reference_backend):
    args = _inputs(4, 3, "cpu", pos_dtype=torch.int32, amp=30.0)
    q = torch.empty(4, 3, 576, dtype=E4M3)

    def step(q_rope, k_rope, q_nope, k_nope, cache, pos, q):
        _, k_rope_out, _, k_nope_out = mla_rope_quantize_fp8(
            q_rope, k_rope, q_nope, k_nope, cache, pos, quant_scale_q=2.0, quant_scale_kv=0.5,
            q_rope_out=q[..., 512:], q_nope_out=q[..., :512])
        return k_rope_out.float().sum() + k_nope_out.float().sum()

    compiled = torch.compile(step, fullgraph=True)
    total = compiled(*args, q)
    refs = _reference(args, True, 2.0, 0.5)
    assert_equal(q[..., 512:], refs[0], name="q_rope_out")
    assert_equal(q[..., :512], refs[2], name="q_nope_out")
    # fp32 sums of the same values in possibly another order: relative 1e-5
    assert_close(total, refs[1].float().sum() + refs[3].float().sum(), rtol=1e-5, atol=1e-3)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("nnz,H", [(8192, 128), (1024, 16), (777, 33), (1, 1)])
@pytest.mark.parametrize("is_neox", [True, False])
def test_gpu_large(nnz, H, is_neox):
    device = "cuda"
    args = _inputs(nnz, H, device, max_seq=4096, cache_dtype=torch.bfloat16 if H == 16 else torch.float32,
                   pos_dtype=torch.int32 if nnz % 2 else torch.int64, amp=40.0)
    q = poisoned((nnz, H, 576), E4M3, device)
    kv = poisoned((nnz, 576), E4M3, device)
    mla_rope_quantize_fp8(*args, is_neox=is_neox, quant_scale_q=1.25, quant_scale_kv=0.75,
                          q_rope_out=q[..., 512:], q_nope_out=q[..., :512], k_rope_out=kv[:, 512:],
                          k_nope_out=kv[:, :512])
    _check([q[..., 512:], kv[:, 512:], q[..., :512], kv[:, :512]], _reference(args, is_neox, 1.25, 0.75), device)


@pytest.mark.gpu
def test_gpu_out_of_range_positions_never_fault():
    args = _inputs(4096, 16, "cuda", max_seq=8)
    args[5][::3] = 1 << 40  # far outside the cache
    args[5][1::3] = -(1 << 40)
    outs = mla_rope_quantize_fp8(*args)
    torch.cuda.synchronize()
    _check(outs, _reference(args, True, 1.0, 1.0), "cuda")
