"""gemm_fp8_nt_groupwise: Triton kernel (interpreter on CPU), both scale modes, FP8 output,
split-K, edges and every documented error."""

from __future__ import annotations

import pytest
import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.testing import assert_close, assert_equal, poisoned
from tests.gemm._inputs import assert_fp8_output_close, fp8_block_operands

# bf16 output: the kernel and the reference both accumulate in fp32 (order differs by
# ~1e-6 relative); the single rounding to bf16 costs <= 1 ulp (2^-8 relative): the
# default bf16 tolerance (atol 1e-2, rtol 1.6e-2) covers it. fp16: 2^-11 relative.


def _ref(a, b, sa_k, sb_k):
    return R.groupwise_fp32_ref(a, b, sa_k, sb_k)


@pytest.mark.parametrize("mode", ["K", "MN"])
@pytest.mark.parametrize("m,n", [(1, 200), (70, 128)])
def test_groupwise_triton_modes(device, triton_backend, mode, m, n):
    a, b, sa, sb = fp8_block_operands(m, n, 256, device)
    out = poisoned((m, n), torch.bfloat16, device)
    if mode == "K":
        res = gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="triton")
    else:  # MN-major scales are read in place
        res = gemm.gemm_fp8_nt_groupwise(a, b, sa.t().contiguous(), sb.t().contiguous(), out=out, backend="triton")
    assert res is out
    assert_close(out, _ref(a, b, sa, sb))


def test_groupwise_fp16_out_and_strided_out(device, triton_backend):
    a, b, sa, sb = fp8_block_operands(64, 128, 128, device)
    big = poisoned((64, 256), torch.float16, device)
    out = big[:, 64:192]  # a strided output (row stride 256)
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=out, out_dtype=torch.float16, backend="triton")
    assert_close(out, _ref(a, b, sa, sb), atol=1e-3, rtol=2e-3)  # fp16: 2^-11 rounding
    assert bool(torch.isnan(big[:, :64]).all()) and bool(torch.isnan(big[:, 192:]).all())


def test_groupwise_split_k(device, triton_backend):
    # m=16, n=128, k=1024: one tile, so the table asks for split-K over 8 k-blocks
    from mate.ops.gemm import tuning

    assert tuning.groupwise_config(16, 128, 1024, fp8_out=False)["SPLIT_K"] > 1
    a, b, sa, sb = fp8_block_operands(16, 128, 1024, device)
    out = poisoned((16, 128), torch.bfloat16, device)
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=out, backend="triton")
    assert_close(out, _ref(a, b, sa, sb))


@pytest.mark.parametrize("k", [128, 1024])  # 1024 goes through split-K and the reduce kernel
@pytest.mark.parametrize("m", [33, 5])  # 5: the M <= 32 configs load A by pointers (A_PTR)
def test_groupwise_fp8_output(device, triton_backend, k, m):
    n = 200
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    b[128:] = 0  # the second column group is all zero: scale 1, zeros out
    out = poisoned((m, n), torch.float8_e4m3fn, device)
    oscale = poisoned((m, 2), torch.float32, device)
    res = gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=out, output_scale=oscale, backend="triton")
    assert res is out
    assert_fp8_output_close(out, oscale, _ref(a, b, sa, sb))
    assert bool((oscale[:, 1] == 1).all()) and bool((out[:, 128:].float() == 0).all())


def test_groupwise_mixed_e5m2(device, triton_backend):
    a, b, sa, sb = fp8_block_operands(64, 64, 128, device, b_dtype=torch.float8_e5m2)
    out = gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, backend="triton")
    assert_close(out, _ref(a, b, sa, sb))


def test_groupwise_reference_backend_on_cpu():
    a, b, sa, sb = fp8_block_operands(5, 130, 256)
    out = gemm.gemm_fp8_nt_groupwise(a, b, sa, sb)  # auto on CPU = the reference
    assert_close(out, _ref(a, b, sa, sb))


def test_groupwise_empty_m(device, triton_backend):
    a, b, sa, sb = fp8_block_operands(0, 128, 128, device)
    out = gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", backend="triton")
    assert out.shape == (0, 128)


def test_groupwise_launcher_gets_views_in_place(device, triton_backend, monkeypatch):
    """No layout copy: the kernel launcher receives the caller's MN-major scale storage."""
    from mate.ops.gemm import groupwise

    seen = {}
    real = groupwise.groupwise_gemm_triton

    def spy(a, b, a_scale, a_str, b_scale, b_str, *args, **kw):
        seen.update(a=a.data_ptr(), b=b.data_ptr(), sa=a_scale.data_ptr(), sb=b_scale.data_ptr(), a_str=a_str)
        return real(a, b, a_scale, a_str, b_scale, b_str, *args, **kw)

    monkeypatch.setattr(groupwise, "groupwise_gemm_triton", spy)
    a, b, sa, sb = fp8_block_operands(64, 128, 256, device)
    sa_mn, sb_mn = sa.t().contiguous(), sb.t().contiguous()
    gemm.gemm_fp8_nt_groupwise(a, b, sa_mn, sb_mn, scale_major_mode="MN", backend="triton")
    assert seen == dict(a=a.data_ptr(), b=b.data_ptr(), sa=sa_mn.data_ptr(), sb=sb_mn.data_ptr(), a_str=(0, 1, 64))


@pytest.mark.parametrize("mode", ["K", "MN"])
def test_groupwise_strided_scales(device, triton_backend, mode):
    """Scales of any strides (transposed views, a column slice of a wider buffer) are read
    in place by the kernel."""
    m, n, k = 40, 200, 384
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    if mode == "K":  # [m, kb] as the view of an M-major buffer; [nb, kb] a slice of a wider one
        sa_in = sa.t().contiguous().t()
        wide = torch.full((sb.shape[0], sb.shape[1] + 5), float("nan"), device=device)
        wide[:, 2:2 + sb.shape[1]] = sb
        sb_in = wide[:, 2:2 + sb.shape[1]]
    else:  # [kb, m] contiguous; [kb, nb] the transposed view of the K-major [nb, kb]
        sa_in, sb_in = sa.t().contiguous(), sb.t()
    assert not (sa_in.is_contiguous() and sb_in.is_contiguous())
    out = poisoned((m, n), torch.bfloat16, device)
    gemm.gemm_fp8_nt_groupwise(a, b, sa_in, sb_in, scale_major_mode=mode, out=out, backend="triton")
    assert_close(out, _ref(a, b, sa, sb))


# ------------------------------------------------------------------ errors


def _args(m=4, n=128, k=256):
    return fp8_block_operands(m, n, k)


def test_error_both_e5m2():
    a, b, sa, sb = _args()
    with pytest.raises(ValueError, match="a and b must not both be torch.float8_e5m2"):
        gemm.gemm_fp8_nt_groupwise(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2), sa, sb)


def test_error_out_dtype_fp32():
    a, b, sa, sb = _args()
    with pytest.raises(ValueError, match="out_dtype"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out_dtype=torch.float32)
    # without out_dtype the output dtype is out's: a wrong one names out (TypeError), as with out_dtype given
    with pytest.raises(TypeError, match=r"out must be one of \(torch.bfloat16, torch.float16\), got torch.float32"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=torch.empty(4, 128))
    with pytest.raises(TypeError, match="out must be torch.bfloat16, got torch.float16"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=torch.empty(4, 128, dtype=torch.float16),
                                   out_dtype=torch.bfloat16)


def test_mate_backend_triton_forces_the_triton_kernels(monkeypatch):
    """MATE_BACKEND=triton runs the Triton kernels on CUDA tensors where auto would pick cuBLAS
    (host-side choice only; no GPU needed); an explicit backend argument still wins."""
    cuda = torch.device("cuda")
    monkeypatch.delenv("MATE_BACKEND", raising=False)
    assert gemm._resolve_backend("auto", cuda, None, lambda: "cublas") == "cublas"
    monkeypatch.setenv("MATE_BACKEND", "triton")
    assert gemm._resolve_backend("auto", cuda, None, lambda: "cublas") == "triton"
    assert gemm._resolve_backend("cublas", cuda, None, lambda: "cublas") == "cublas"
    monkeypatch.setenv("MATE_BACKEND", "reference")
    assert gemm._resolve_backend("auto", cuda, None, lambda: "cublas") == "reference"


def test_error_ambiguous_scale_mode():
    # m == kb == nb == 2: both readings fit
    a, b, sa, sb = _args(m=2, n=256, k=256)
    with pytest.raises(ValueError, match="scale_major_mode must be given"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb)
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K")  # explicit mode works


def test_error_scale_shapes_and_mode():
    a, b, sa, sb = _args()
    with pytest.raises(ValueError, match="a_scale and b_scale must have shapes"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa[:, :1].contiguous(), sb)
    with pytest.raises(ValueError, match="a_scale must have shape"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN")
    with pytest.raises(ValueError, match="scale_major_mode"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="X")
    with pytest.raises(TypeError, match="a_scale must be torch.float32"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa.half(), sb)


def test_error_granularity_k_and_shapes():
    a, b, sa, sb = _args()
    with pytest.raises(ValueError, match="scale_granularity_mnk"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_granularity_mnk=(1, 128, 64))
    a2, b2 = a[:, :192].contiguous(), b[:, :192].contiguous()
    with pytest.raises(ValueError, match="k .*multiple of 128"):
        gemm.gemm_fp8_nt_groupwise(a2, b2, sa, sb)
    with pytest.raises(ValueError, match="b must have shape"):
        gemm.gemm_fp8_nt_groupwise(a, b[:, :128].contiguous(), sa, sb)
    with pytest.raises(TypeError, match="a must be one of"):
        gemm.gemm_fp8_nt_groupwise(a.float(), b, sa, sb)
    with pytest.raises(ValueError, match="a must have a contiguous last dimension"):
        gemm.gemm_fp8_nt_groupwise(a.t().contiguous().t(), b, sa, sb)


def test_error_out_and_output_scale():
    a, b, sa, sb = _args()
    with pytest.raises(ValueError, match="out must have shape"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=torch.empty(4, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out must be"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=torch.empty(4, 128, dtype=torch.float16),
                                   out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="output_scale must have shape"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, output_scale=torch.empty(4, 2))
    with pytest.raises(ValueError, match="out_dtype"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, output_scale=torch.empty(4, 1), out_dtype=torch.bfloat16)


def test_error_backends_on_cpu(monkeypatch):
    a, b, sa, sb = _args()
    with pytest.raises(ValueError, match="backend 'cublas' needs CUDA tensors"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, backend="cublas")
    with pytest.raises(ValueError, match="backend must be one of"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, backend="cutlass")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="interpreter"):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, backend="triton")


def test_custom_op_opcheck_and_compile():
    a, b, sa, sb = _args(m=8, n=128, k=128)
    out = torch.empty(8, 128, dtype=torch.bfloat16)
    op = torch.ops.mate.gemm_fp8_nt_groupwise
    # test_schema compares fp8 inputs with ops torch lacks for fp8 on CPU: the other checks run
    torch.library.opcheck(op, (a, b, sa, sb, True, out, None, "reference"),
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    fn = torch.compile(lambda *x: gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="K"), fullgraph=False)
    assert_close(fn(a, b, sa, sb), _ref(a, b, sa, sb))


@pytest.mark.parametrize("m,n", [(1, 128), (37, 200), (64, 2112)])
def test_quantize_row_groups_matches_reference(device, triton_backend, m, n):
    """The two-step FP8 output's second launch equals the reference quantizer bit for bit
    (same fp32 amax, division and saturating round to nearest even): a zero group (scale 1),
    a partial last group, values past the e4m3 range, rows past a multiple of 32."""
    from mate.ops.gemm.quantize import quantize_fp8_row_groups

    x = (torch.randn(m, n, device=device) * 100).to(torch.bfloat16)
    x[:, :128][::2] = 0
    nb = -(-n // 128)
    out = poisoned((m, n), torch.float8_e4m3fn, device)
    scale = poisoned((m, nb), torch.float32, device)
    quantize_fp8_row_groups(x, out, scale)
    want_q, want_s = R.quantize_fp8_row_groups_ref(x.float())
    assert_equal(scale, want_s)
    assert_equal(out.view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("bf16", ["triton"])
def test_groupwise_fp8_output_two_step(device, triton_backend, bf16):
    """The two-step FP8 output (bf16 result, then quantized) against the fp32 reference with
    the bf16 rounding's 2^-8 added to the tolerances."""
    m, n, k = 33, 200, 256
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.float8_e4m3fn, device)
    oscale = poisoned((m, 2), torch.float32, device)
    gemm._gemm_fp8_nt_groupwise_op(a, b, sa, sb, True, out, oscale, bf16 + "+quant")
    assert_fp8_output_close(out, oscale, _ref(a, b, sa, sb), via_bf16=True)
