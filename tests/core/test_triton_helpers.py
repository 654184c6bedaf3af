"""The interpreter-safe Triton helpers of ``mate._core.triton_helpers``.

Each helper runs inside a tiny kernel on the ``device`` fixture (the CPU under Triton's
interpreter in CI, the H200 in the GPU suite) and is compared bit for bit with torch's
own conversion of the same fp32 values.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from mate._core.triton_helpers import (  # noqa: E402
    cdiv,
    dot_operand,
    finish_softmax,
    next_power_of_2,
    online_softmax_step,
    to_bf16,
    to_fp8_e4m3,
    to_out_dtype,
)
from mate.testing import assert_close, assert_equal, poisoned  # noqa: E402

BLOCK = 16384  # few programs: the interpreter costs ~0.35 ms per program plus numpy work


@triton.jit
def _convert_kernel(x_ptr, y_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, to_out_dtype(x, OUT), mask=mask)


@triton.jit
def _fp8_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, to_fp8_e4m3(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def _bf16_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, to_bf16(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    acc = tl.dot(dot_operand(a), dot_operand(b))
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


_TL_DTYPE = {
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
    torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv,
}


def _special_values() -> torch.Tensor:
    """The fp32 values where conversions go wrong: signed zeros, fp32 subnormals, the
    e4m3 subnormal range and its rounding ties, the saturation boundary, huge values,
    infinities and NaN (only the positive quiet NaN: its byte is the same on every path)."""
    e4m3_sub = torch.arange(-24, 25, dtype=torch.float32) * 2.0**-10  # ties at odd multiples of 2**-10
    boundary = torch.tensor([440.0, 447.9, 448.0, 448.1, 463.9, 464.0, 464.1, 479.9, 480.0, 500.0, 1e4])
    ties = torch.tensor([1.0625, 1.1875, 3.25, 3.75, 0.0146484375, 0.015625 - 2.0**-12])
    misc = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-39, -1e-39, 2.0**-126, 1e-7, -1e-7,
                         3.0e38, -3.0e38, float("inf"), float("-inf"), float("nan")])
    vals = torch.cat([e4m3_sub, boundary, -boundary, ties, -ties, misc])
    return vals.float()


def _random_values(n: int) -> torch.Tensor:
    """~n fp32 values over many binades: normal * 2**k for k in [-20, 20] plus raw random
    bit patterns (every finite fp32 exponent, subnormals included)."""
    scaled = torch.randn(n // 2) * torch.exp2(torch.randint(-20, 21, (n // 2,)).float())
    bits = torch.randint(-(2**31), 2**31 - 1, (n // 2,), dtype=torch.int64).to(torch.int32).view(torch.float32)
    bits = torch.where(torch.isnan(bits), torch.zeros_like(bits), bits)  # NaN payloads: tested apart
    return torch.cat([scaled, bits, _special_values()])


def _run(kernel, x: torch.Tensor, dtype: torch.dtype, **kw) -> torch.Tensor:
    y = poisoned(x.shape, dtype, device=x.device)
    kernel[(cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK, **kw)
    return y


def _torch_fp8(x: torch.Tensor) -> torch.Tensor:
    """The spec's cast: saturate to +-448 (NaN stays NaN), round to nearest even."""
    return torch.where(torch.isnan(x), x, x.clamp(-448.0, 448.0)).to(torch.float8_e4m3fn)


def test_to_fp8_e4m3_bit_exact(device):
    x = _random_values(100_000).to(device)
    y = _run(_fp8_kernel, x, torch.float8_e4m3fn)
    ref = _torch_fp8(x.cpu())
    # bit patterns compared (assert_equal): -0.0, subnormals, ties and saturation must all match
    assert_equal(y, ref, name="to_fp8_e4m3")


def test_to_fp8_e4m3_saturates_and_keeps_nan(device):
    x = torch.tensor([1e30, -1e30, float("inf"), float("-inf"), 449.0, -1000.0,
                      float("nan"), -float("nan")], device=device)
    y = _run(_fp8_kernel, x, torch.float8_e4m3fn).float().cpu()
    assert_equal(y[:6], torch.tensor([448.0, -448.0, 448.0, -448.0, 448.0, -448.0]))
    assert torch.isnan(y[6:]).all()  # the sign of a NaN is not specified


def test_to_bf16_bit_exact(device):
    x = _random_values(100_000).to(device)
    y = _run(_bf16_kernel, x, torch.bfloat16)
    ref = x.cpu().to(torch.bfloat16)  # torch rounds to nearest even
    assert_equal(y, ref, name="to_bf16")  # bit patterns, including -0.0 and fp32 subnormals


def test_to_bf16_nan_payloads_stay_nan(device):
    # NaNs whose payload sits in the low 16 bits, or is all ones: rounding must not turn
    # them into infinities or wrap the sign
    bits = torch.tensor([0x7F800001, 0x7F807FFF, 0x7FFFFFFF, -1, 0x7FC00000, -8388607], dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32).to(device)
    assert torch.isnan(x).all()
    y = _run(_bf16_kernel, x, torch.bfloat16).cpu()
    assert torch.isnan(y.float()).all(), y.view(torch.int16)
    assert_equal(y, x.cpu().to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_to_out_dtype(device, dtype):
    n = 3 * 1000 + 17  # not a multiple of the block: the tail is masked
    x = (torch.randn(n) * torch.exp2(torch.randint(-12, 12, (n,)).float())).to(device)
    y = poisoned((n,), dtype, device=device)
    _convert_kernel[(cdiv(n, 1024),)](x, y, n, OUT=_TL_DTYPE[dtype], BLOCK=1024)
    ref = _torch_fp8(x.cpu()) if dtype == torch.float8_e4m3fn else x.cpu().to(dtype)
    assert_equal(y, ref)


def test_dot_operand_bf16_dot_equals_fp32(device):
    M, N, K = 64, 64, 64
    a = torch.randn(M, K, device=device).to(torch.bfloat16)
    b = torch.randn(K, N, device=device).to(torch.bfloat16)
    c = poisoned((M, N), torch.float32, device=device)
    _dot_kernel[(1,)](a, b, c, M=M, N=N, K=K)
    ref = a.double() @ b.double()
    # bf16 x bf16 products are exact in fp32; only the fp32 summation order differs
    # (64 terms of size ~1: |error| <= 64 * 2**-24 * sum|a||b| ~ 1e-4 worst case)
    assert_close(c, ref.float(), atol=1e-4, rtol=1e-5)


@triton.jit
def _softmax_kernel(s_ptr, w_ptr, lse_ptr, ROWS: tl.constexpr, KEYS: tl.constexpr, TILE: tl.constexpr):
    """Row softmax of s [ROWS, KEYS] (log2 units) tile by tile: w = softmax, lse in natural log."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, TILE)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    for k0 in range(0, KEYS, TILE):
        s = tl.load(s_ptr + rows[:, None] * KEYS + k0 + cols[None, :])
        m_i, p, alpha, l_i = online_softmax_step(s, m_i, l_i)
    l_safe, lse = finish_softmax(m_i, l_i)
    tl.store(lse_ptr + rows, lse)
    for k0 in range(0, KEYS, TILE):
        s = tl.load(s_ptr + rows[:, None] * KEYS + k0 + cols[None, :])
        w = tl.exp2(s - tl.where(m_i == float("-inf"), 0.0, m_i)[:, None]) / l_safe[:, None]
        tl.store(w_ptr + rows[:, None] * KEYS + k0 + cols[None, :], w)


def test_online_softmax_step_and_finish(device):
    """Tile-by-tile softmax against float64: rows whose first tiles are all -inf (the rescale
    from a -inf max must give no NaN), and a row with no visible key (lse -inf, w 0)."""
    rows, keys, tile = 16, 64, 16
    s = torch.randn(rows, keys) * 8
    s[1, :40] = float("-inf")  # the max appears in the third tile
    s[2, 3::5] = float("-inf")
    s[3] = float("-inf")  # sees no key
    w = poisoned((rows, keys), torch.float32, device=device)
    lse = poisoned((rows,), torch.float32, device=device)
    _softmax_kernel[(1,)](s.to(device), w, lse, ROWS=rows, KEYS=keys, TILE=tile)
    nat = s.double() * torch.log(torch.tensor(2.0, dtype=torch.float64))
    want_lse = torch.logsumexp(nat, dim=1)
    want_w = torch.nan_to_num(torch.softmax(nat, dim=1), nan=0.0)
    assert_close(lse, want_lse.float(), atol=1e-5, rtol=1e-5, name="lse")
    assert_close(w, want_w.float(), atol=1e-6, rtol=1e-5)
    assert bool(torch.isneginf(lse[3].cpu())) and bool((w[3].cpu() == 0).all())


def test_cdiv_and_next_power_of_2():
    assert [cdiv(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert [next_power_of_2(n) for n in (1, 3, 64, 65, 576)] == [1, 4, 64, 128, 1024]
    # the host launch code's plain-Python versions agree with Triton's on every size it sees
    import triton

    for n in range(0, 5000):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 128):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
    for n in (2**31 - 1, 2**31, 2**40 + 3):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


@pytest.mark.gpu
@pytest.mark.parametrize(
    "check",
    [
        test_to_fp8_e4m3_bit_exact,
        test_to_fp8_e4m3_saturates_and_keeps_nan,
        test_to_bf16_bit_exact,
        test_to_bf16_nan_payloads_stay_nan,
        test_dot_operand_bf16_dot_equals_fp32,
        test_online_softmax_step_and_finish,
        *[lambda device, d=d: test_to_out_dtype(device, d) for d in _TL_DTYPE],
    ],
)
def test_hardware_paths_on_the_gpu(check):
    # the GPU suite runs only tests marked gpu: the same checks through the hardware
    # conversions and wgmma instead of the interpreter's software paths
    check("cuda")
