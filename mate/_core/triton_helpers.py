"""Triton helpers that are exact both on the GPU and under Triton's CPU interpreter.

The interpreter gets a few conversions wrong without an error (bf16 arithmetic on raw
bits, fp32 -> bf16 truncation, fp32 -> e4m3 rounding and saturation, bf16 ``tl.dot``).
The module-level constexpr ``INTERPRET`` selects exact software paths there, so GPU
builds keep the hardware conversions and tensor-core MMAs.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

FP8_E4M3_MAX: tl.constexpr = tl.constexpr(448.0)

__all__ = [
    "INTERPRET",
    "FP8_E4M3_MAX",
    "to_fp8_e4m3",
    "to_bf16",
    "to_out_dtype",
    "dot_operand",
    "online_softmax_step",
    "finish_softmax",
    "cdiv",
    "next_power_of_2",
]


# Host-side launch arithmetic in plain Python: ``triton.cdiv`` / ``triton.next_power_of_2`` are
# ConstexprFunction objects whose calls cost ~2 us each on the host, several per op call.
def cdiv(a: int, b: int) -> int:
    """Ceiling division of ints (``triton.cdiv`` on the host)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, 0 for n <= 0 (``triton.next_power_of_2`` on the host)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@triton.jit
def _rne_int(y):
    # Round to nearest even for |y| < 2**22 with the 1.5 * 2**23 magic constant.
    return (y + 12582912.0) - 12582912.0


@triton.jit
def _e4m3_bits(x):
    """fp32 -> the e4m3fn byte (as uint8), round to nearest even, saturating, NaN -> 0x7F."""
    is_nan = x != x
    ax = tl.where(is_nan, 0.0, tl.minimum(tl.abs(x), 448.0))
    bits = ax.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1
    bits = bits + 0x7FFFF + lsb
    exp = ((bits >> 23) & 0xFF).to(tl.int32) - 120
    normal = (exp << 3) | ((bits >> 20) & 7).to(tl.int32)
    # |x| < 2**-6: subnormal multiples of 2**-9 (a result of 8 is the smallest normal)
    sub = _rne_int(ax * 512.0).to(tl.int32)
    mag = tl.where(ax < 0.015625, sub, normal)
    # the sign bit, not ``x < 0``: -0.0 becomes the byte 0x80, as torch's cast gives
    sign = ((x.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.int32)
    byte = tl.where(is_nan, 0x7F, mag | sign)
    return byte.to(tl.uint8)


@triton.jit
def to_fp8_e4m3(x):
    """Saturating fp32 -> float8_e4m3fn conversion (NaN stays NaN)."""
    if INTERPRET:
        return _e4m3_bits(x).to(tl.float8e4nv, bitcast=True)
    else:
        xc = tl.where(x != x, x, tl.minimum(tl.maximum(x, -448.0), 448.0))
        return xc.to(tl.float8e4nv)


@triton.jit
def to_bf16(x):
    """fp32 -> bf16 with round to nearest even (the interpreter truncates)."""
    if INTERPRET:
        # round the fp32 bits, then reinterpret the upper half: the interpreter's own
        # fp32 -> bf16 cast is also wrong for fp32 subnormals. NaN is kept apart, since
        # rounding could carry a NaN payload into an infinity or the sign bit.
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        bits = tl.where(x != x, 0x7FC0, bits)
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def to_out_dtype(x, dtype: tl.constexpr):
    """fp32 -> ``dtype`` (bf16, fp16, fp32 or e4m3), exact under the interpreter."""
    if dtype == tl.bfloat16:
        return to_bf16(x)
    elif dtype == tl.float8e4nv:
        return to_fp8_e4m3(x)
    else:
        return x.to(dtype)


@triton.jit
def dot_operand(x):
    """Operand for ``tl.dot``: bf16 tiles become fp32 under the interpreter (exact)."""
    if INTERPRET:
        if x.dtype == tl.bfloat16:
            return x.to(tl.float32)
        else:
            return x
    else:
        return x


@triton.jit
def online_softmax_step(s, m_i, l_i):
    """One key tile of an exp2-domain online softmax over the rows of ``s`` [rows, keys]:
    (new running max, probabilities, rescale factor of the old sum and accumulator, new sum).
    A row that has seen no visible key keeps max -inf with p = 0 and no NaN."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, p, alpha, l_i


@triton.jit
def finish_softmax(m_i, l_i):
    """(denominator safe to divide by, natural-log LSE; -inf for rows that saw no key) of an
    exp2-domain online softmax with running max ``m_i`` and sum ``l_i``."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    return l_safe, lse
