"""Random inputs shared by the GEMM tests (fresh random data on every call) and the direct
launch of the plain-layout Triton groupwise kernel."""

from __future__ import annotations

import torch

from mate.ops.gemm import reference as R
from mate.testing import assert_close, rand_fp8


def fp8_block_operands(m: int, n: int, k: int, device="cpu", a_dtype=torch.float8_e4m3fn,
                       b_dtype=torch.float8_e4m3fn):
    """a [m, k], b [n, k] FP8 with K-major fp32 scales a_scale [m, k/128], b_scale [ceil(n/128), k/128]."""
    a = rand_fp8((m, k), device=device, scale=2.0).to(a_dtype)
    b = rand_fp8((n, k), device=device, scale=2.0).to(b_dtype)
    kb, nb = k // 128, -(-n // 128)
    a_scale = torch.rand(m, kb, device=device) * 0.02 + 0.005
    b_scale = torch.rand(nb, kb, device=device) * 0.02 + 0.005
    return a, b, a_scale, b_scale


def launch_groupwise_plain(a, b, sa, sb, out, config: dict, k_major: bool = True) -> None:
    """``groupwise_gemm_triton`` on a [m, k] x [n, k] problem with K-major scales ``sa`` /
    ``sb`` ([m, k/128], [ceil(n/128), k/128]), passed as they are (``k_major``) or as
    transposed contiguous copies read through MN-major strides."""
    from mate.ops.gemm.groupwise import PLAIN, groupwise_gemm_triton

    s_a = sa if k_major else sa.t().contiguous()
    s_b = sb if k_major else sb.t().contiguous()
    a_mk = s_a if k_major else s_a.t()
    b_nk = s_b if k_major else s_b.t()
    groupwise_gemm_triton(a, b, s_a, (0, a_mk.stride(0), a_mk.stride(1)), s_b, (0, b_nk.stride(0), b_nk.stride(1)),
                          out, None, layout=PLAIN, config=config)


def fp64_groupwise_loop(a, b, a_scale, b_scale):
    """Plain float64 triple loop over (i, j, k-block): the definition, for tiny inputs."""
    m, k = a.shape
    n = b.shape[0]
    A, B = a.double().cpu(), b.double().cpu()
    sa, sb = a_scale.double().cpu(), b_scale.double().cpu()
    out = torch.zeros(m, n, dtype=torch.float64)
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for kb in range(k // 128):
                blk = float((A[i, kb * 128:(kb + 1) * 128] * B[j, kb * 128:(kb + 1) * 128]).sum())
                acc += float(sa[i, kb]) * float(sb[j // 128, kb]) * blk
            out[i, j] = acc
    return out


def assert_fp8_output_close(out: torch.Tensor, oscale: torch.Tensor, ref: torch.Tensor,
                            via_bf16: bool = False) -> None:
    """FP8 output ``out`` [M, N] with per-(row, 128 columns) scales ``oscale`` against the fp32
    reference ``ref``. The interpreter's products are exact, so its results (and their amax)
    differ from the reference by accumulation order only (~1e-6 relative). Hopper FP8 MMAs keep
    ~14 bits while accumulating a 128-wide K block, so on the GPU results differ by ~1e-4 of the
    row's magnitude (measured up to 1.4e-4 on the scales, 2.7e-4 at K = 128 and, in session 22's
    GPU run, 2.72e-4 at M = 64, N = 7168, K = 2048: 0.1128 units quantized to 0.2344): that is up
    to 448 * 2.72e-4 = 0.122 units of the group scale (amax / 448) on any element however small
    (other measurements on the H200: 0.088 quantized to 0.0625, 0.67 to 0.625), and atol 448 *
    4e-4 = 0.179 units covers it with margin (2.5e-4, 0.112 units, failed that run). e4m3
    rounding adds <= 2^-4 relative or 2^-10 absolute (subnormals).
    ``via_bf16``: the two-step path quantizes the bf16-rounded result, <= 2^-8 relative (bf16 unit roundoff) from
    it, which the scales' and (through the scale and the element) the elements' relative
    tolerances add."""
    _, want = R.quantize_fp8_row_groups_ref(ref)
    gpu = out.is_cuda
    bf16 = 2 ** -8 if via_bf16 else 0.0
    assert_close(oscale, want, atol=0.0, rtol=(1e-3 if gpu else 1e-5) + bf16, name="output scales")
    scale_e = oscale.repeat_interleave(128, dim=1)[:, :out.shape[1]]
    assert_close(out.float(), ref / scale_e, atol=448 * 4e-4 if gpu else 2 ** -9,
                 rtol=2 ** -4 + (1e-3 if gpu else 1e-4) + 2 * bf16, name="fp8 output")
