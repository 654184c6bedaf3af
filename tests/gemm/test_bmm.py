"""bmm_bf16 and bmm_fp8: Triton kernel (interpreter on CPU), reference, layouts, errors."""

from __future__ import annotations

import pytest
import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.testing import assert_close, poisoned, rand_fp8, randn

# bf16/fp16 output of an fp32 accumulation: one output rounding (bf16 2^-8, fp16 2^-11
# relative); the DTYPE_TOL defaults cover it. fp32 output: accumulation order only.


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_bmm_bf16_triton_transposed_b(device, triton_backend, out_dtype):
    A = randn((2, 70, 96), device=device)
    Bt = randn((2, 130, 96), device=device)
    B = Bt.transpose(1, 2)  # [b, k, n] view of a contiguous [b, n, k]: read in place
    out = poisoned((2, 70, 130), out_dtype, device)
    res = gemm.bmm_bf16(A, B, out=out, out_dtype=out_dtype, backend="triton")
    assert res is out
    tol = {} if out_dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    assert_close(out, torch.bmm(A.double(), B.double()).to(out_dtype), **tol)


def test_bmm_bf16_fp16_reference_cpu():
    A = randn((3, 5, 7), torch.float16)
    B = randn((3, 7, 9), torch.float16)
    out = gemm.bmm_bf16(A, B, out_dtype=torch.float16)
    assert_close(out, torch.bmm(A.double(), B.double()).half())


def test_bmm_bf16_no_layout_copy(device, triton_backend, monkeypatch):
    """The launcher receives the caller's transposed view itself (same data pointer, strides)."""
    from mate.ops.gemm import bmm as bmm_mod

    seen = {}
    real = bmm_mod.bmm_triton

    def spy(A, B, out, *args, **kw):
        seen.update(a=(A.data_ptr(), A.stride()), b=(B.data_ptr(), B.stride()))
        return real(A, B, out, *args, **kw)

    monkeypatch.setattr(bmm_mod, "bmm_triton", spy)
    A = randn((1, 64, 64), device=device)
    B = randn((1, 64, 64), device=device).transpose(1, 2)
    gemm.bmm_bf16(A, B, backend="triton")
    assert seen == {"a": (A.data_ptr(), A.stride()), "b": (B.data_ptr(), B.stride())}


@pytest.mark.parametrize("scales", ["tensor", "channel"])
def test_bmm_fp8_triton(device, triton_backend, scales):
    b, m, k, n = 2, 33, 160, 72  # k and n not multiples of the tiles
    A = rand_fp8((b, m, k), device=device)
    B = rand_fp8((b, n, k), device=device).transpose(1, 2)
    if scales == "tensor":
        sa, sb = torch.rand(1, device=device) + 0.5, torch.rand(1, device=device) + 0.5
    else:
        sa, sb = torch.rand(b, m, 1, device=device) + 0.5, torch.rand(b, 1, n, device=device) + 0.5
    out = poisoned((b, m, n), torch.bfloat16, device)
    gemm.bmm_fp8(A, B, sa, sb, torch.bfloat16, out=out, backend="triton")
    assert_close(out, R.bmm_fp8_ref(A, B, sa, sb, torch.float32))


def test_bmm_fp8_fp16_e5m2_row_major_b(device, triton_backend):
    A = rand_fp8((1, 16, 64), device=device)
    B = rand_fp8((1, 64, 48), device=device).to(torch.float8_e5m2)  # row-major B: Triton path
    sa, sb = torch.full((1,), 0.5, device=device), torch.full((1,), 2.0, device=device)
    out = gemm.bmm_fp8(A, B, sa, sb, torch.float16, backend="auto")
    assert_close(out, R.bmm_fp8_ref(A, B, sa, sb, torch.float32))


def test_bmm_empty(device, triton_backend):
    A = randn((2, 0, 64), device=device)
    B = randn((2, 64, 8), device=device)
    assert gemm.bmm_bf16(A, B, backend="triton").shape == (2, 0, 8)


def test_bmm_errors():
    A, B = randn((2, 4, 8)), randn((2, 8, 3))
    with pytest.raises(ValueError, match="A must be 3-D"):
        gemm.bmm_bf16(A[0], B)
    with pytest.raises(ValueError, match="B must have shape"):
        gemm.bmm_bf16(A, randn((2, 9, 3)))
    with pytest.raises(TypeError, match="B must be torch.bfloat16"):
        gemm.bmm_bf16(A, B.half())
    with pytest.raises(ValueError, match="out_dtype"):
        gemm.bmm_bf16(A, B, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="out must have shape"):
        gemm.bmm_bf16(A, B, out=torch.empty(2, 4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="backend 'cublas' needs CUDA"):
        gemm.bmm_bf16(A, B, backend="cublas")
    A8, B8 = rand_fp8((2, 4, 32)), rand_fp8((2, 32, 3))
    one = torch.ones(1)
    with pytest.raises(ValueError, match="A and B must not both be torch.float8_e5m2"):
        gemm.bmm_fp8(A8.to(torch.float8_e5m2), B8.to(torch.float8_e5m2), one, one, torch.bfloat16)
    with pytest.raises(ValueError, match="A_scale must have shape"):
        gemm.bmm_fp8(A8, B8, torch.ones(2, 4), torch.ones(2, 1, 3), torch.bfloat16)
    with pytest.raises(TypeError, match="B_scale must be torch.float32"):
        gemm.bmm_fp8(A8, B8, one, one.half(), torch.bfloat16)
    with pytest.raises(ValueError, match=r"^dtype must be one of .*got torch.float32"):
        gemm.bmm_fp8(A8, B8, one, one, torch.float32)
    with pytest.raises(ValueError, match=r"^dtype must be one of .*got None"):  # dtype is required
        gemm.bmm_fp8(A8, B8, one, one, None)
    with pytest.raises(TypeError, match="out must be torch.bfloat16, got torch.float32"):
        gemm.bmm_fp8(A8, B8, one, one, torch.bfloat16, out=torch.empty(2, 4, 3))
    with pytest.raises(ValueError, match="out must not overlap itself"):  # an expanded output view
        gemm.bmm_bf16(A, B, out=torch.empty(1, 1, 3, dtype=torch.bfloat16).expand(2, 4, 3))


def test_bmm_opcheck():
    A, B = randn((2, 4, 8)), randn((2, 8, 3))
    out = torch.empty(2, 4, 3, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.mate.gemm_bmm_bf16, (A, B, out, "reference"))
