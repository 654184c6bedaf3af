"""The comparison and input helpers of ``mate.testing``: they must catch what kernels get
wrong (NaN, unwritten elements, out-of-tolerance values, bit differences)."""

from __future__ import annotations

import pytest
import torch

from mate.testing import assert_close, assert_equal, poisoned, rand_fp8, randn, rel_error
from mate.testing.numeric import DTYPE_TOL

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float64]
FP8_ALL = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
           if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", FLOATS + FP8_ALL[1:])
def test_poisoned_float_is_all_nan(dtype):
    t = poisoned((3, 5), dtype)
    assert t.shape == (3, 5) and t.dtype == dtype
    assert torch.isnan(t.float()).all()


@pytest.mark.parametrize(("dtype", "value"), [(torch.int32, 2**31 - 1), (torch.int64, 2**63 - 1),
                                              (torch.uint8, 255), (torch.int16, 2**15 - 1), (torch.bool, True)])
def test_poisoned_int_is_max(dtype, value):
    t = poisoned((4,), dtype)
    assert t.dtype == dtype and bool((t == value).all())


def test_poisoned_empty():
    assert poisoned((0, 7), torch.bfloat16).shape == (0, 7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_assert_close_catches_an_unwritten_poisoned_element(dtype):
    ref = torch.randn(8, 65).to(dtype)
    out = poisoned(ref.shape, dtype)
    out[:, :64] = ref[:, :64]  # the kernel "forgot" the tail column
    with pytest.raises(AssertionError, match="NaN pattern differs"):
        assert_close(out, ref)
    out[:, 64] = ref[:, 64]
    assert_close(out, ref)


def test_assert_close_per_element_atol():
    """A tensor atol bounds each element by its own value (broadcast to the reference)."""
    ref = torch.zeros(4, 3)
    out = ref.clone()
    out[1, 2] = 0.5
    atol = torch.tensor([0.1, 0.1, 0.6])  # broadcasts over rows: column 2 allows 0.6
    assert_close(out, ref, atol=atol, rtol=0.0)
    with pytest.raises(AssertionError, match=r"1 of 12 elements outside atol=per element \(max 0.45\)"):
        assert_close(out, ref, atol=torch.tensor([0.1, 0.1, 0.45]), rtol=0.0)


def test_assert_close_catches_a_nan_and_a_missing_nan():
    ref = torch.randn(100)
    out = ref.clone()
    out[37] = float("nan")
    with pytest.raises(AssertionError, match=r"1 NaN in output, 0 in reference"):
        assert_close(out, ref)
    ref2 = ref.clone()
    ref2[3] = float("nan")
    with pytest.raises(AssertionError, match=r"0 NaN in output, 1 in reference"):
        assert_close(ref, ref2)
    out = ref.clone()
    out[3] = float("nan")
    assert_close(out, ref2)  # NaN where the reference has NaN is fine


def test_assert_close_infinities():
    ref = torch.tensor([1.0, float("inf"), -float("inf")])
    assert_close(ref.clone(), ref)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(torch.tensor([1.0, float("inf"), float("inf")]), ref)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(torch.tensor([1.0, 3e38, -float("inf")]), ref)
    with pytest.raises(AssertionError, match="outside"):
        assert_close(torch.tensor([float("inf"), float("inf"), -float("inf")]), ref)


def test_assert_close_catches_one_element_out_of_tolerance():
    ref = torch.randn(16, 16, dtype=torch.float64)
    out = ref.clone().float()
    out[5, 9] += 1e-3
    msg = r"1 of 256 elements outside atol=1e-05, rtol=1e-05.*first at \[\[5, 9\]\]"
    with pytest.raises(AssertionError, match=msg):
        assert_close(out, ref)
    assert_close(out, ref, atol=2e-3)  # explicit tolerances override the dtype defaults
    # an element just inside atol + rtol * |ref| passes, just outside fails
    ref = torch.tensor([2.0], dtype=torch.float64)
    assert_close(torch.tensor([2.0 + 0.99 * (0.1 + 0.05 * 2.0)]), ref, atol=0.1, rtol=0.05)
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([2.0 + 1.01 * (0.1 + 0.05 * 2.0)]), ref, atol=0.1, rtol=0.05)


def test_assert_close_dtype_defaults():
    # bf16 default: within one or two bf16 ulps of the reference is accepted, more is not
    ref = torch.randn(1000, dtype=torch.float64) + 3.0
    atol, rtol = DTYPE_TOL[torch.bfloat16]
    assert_close(ref.to(torch.bfloat16), ref)
    bad = ref.to(torch.bfloat16)
    bad[0] = (ref[0] * (1 + 2 * rtol) + 2 * atol).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="outside"):
        assert_close(bad, ref)


def test_assert_close_shape_and_rel_error():
    with pytest.raises(AssertionError, match=r"shape \(2, 3\) != \(3, 2\)"):
        assert_close(torch.zeros(2, 3), torch.zeros(3, 2))
    ref = torch.tensor([3.0, 4.0])
    out = torch.tensor([3.0, 4.5])
    assert rel_error(out, ref) == pytest.approx(0.1)
    assert rel_error(torch.zeros(2), torch.zeros(2)) == 0.0
    with pytest.raises(AssertionError, match="relative error 0.1 > 0.05"):
        assert_close(out, ref, atol=1.0, max_rel_error=0.05)
    assert_close(out, ref, atol=1.0, max_rel_error=0.11)


def test_assert_close_empty():
    assert_close(torch.empty(0, 4), torch.empty(0, 4))


@pytest.mark.parametrize("dtype", FLOATS)
def test_assert_equal_is_bit_exact(dtype):
    ref = (torch.randn(64) * 10).to(dtype)
    assert_equal(ref.clone(), ref)
    # the smallest change: one unit in the last place of one element
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[ref.element_size()]
    out = ref.clone()
    out.view(bits)[17] += 1
    with pytest.raises(AssertionError, match=r"1 of 64 elements differ; first at \[\[17\]\]"):
        assert_equal(out, ref)
    # signed zeros differ bitwise
    z = torch.zeros(3, dtype=dtype)
    with pytest.raises(AssertionError, match="1 of 3 elements differ"):
        assert_equal(z, torch.tensor([0.0, -0.0, 0.0]).to(dtype))
    # NaN equals NaN
    n = torch.tensor([1.0, float("nan")]).to(dtype)
    assert_equal(n.clone(), n)


def test_assert_equal_ints_shape_dtype():
    a = torch.arange(10, dtype=torch.int32)
    assert_equal(a.clone(), a)
    b = a.clone()
    b[9] = -1
    with pytest.raises(AssertionError, match=r"first at \[\[9\]\]: \[-1\] vs \[9\]"):
        assert_equal(b, a)
    with pytest.raises(AssertionError, match="dtype"):
        assert_equal(a.long(), a)
    with pytest.raises(AssertionError, match="shape"):
        assert_equal(a[:5], a)


def test_randn_and_rand_fp8():
    x = randn((64, 32), torch.bfloat16, scale=3.0)
    assert x.shape == (64, 32) and x.dtype == torch.bfloat16
    assert 1.5 < x.float().std().item() < 4.5  # 2048 samples of N(0, 9)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert_equal(randn((8,), generator=g1), randn((8,), generator=g2))
    f = rand_fp8((4096,), scale=1000.0)
    assert f.dtype == torch.float8_e4m3fn
    ff = f.float()
    assert torch.isfinite(ff).all() and ff.abs().max().item() == 448.0  # saturated, never NaN


def test_moe_contiguous_operands():
    from mate.testing.inputs import moe_contiguous_operands

    a, sa, b, sb, idx = moe_contiguous_operands(3, 5, 200, 256, "cpu")
    assert a.shape == (15, 256) and a.dtype == torch.float8_e4m3fn and sa.shape == (15, 2)
    assert b.shape == (3, 200, 256) and b.dtype == torch.float8_e4m3fn and sb.shape == (3, 2, 2)
    assert idx.dtype == torch.int32 and idx.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert bool(((sa >= 0.001) & (sa < 0.011)).all()) and bool(((sb >= 0.001) & (sb < 0.011)).all())


def test_grouped_contiguous_operands():
    from mate.testing.inputs import grouped_contiguous_operands

    idx, a, sa, b, sb = grouped_contiguous_operands([3, 0, 130], 200, 256)
    assert idx.dtype == torch.int32 and idx.tolist() == [0] * 3 + [-1] * 125 + [2] * 130 + [-1] * 126
    assert a.shape == (384, 256) and a.dtype == torch.float8_e4m3fn and sa.shape == (384, 2)
    assert b.shape == (3, 200, 256) and sb.shape == (3, 2, 2)  # ceil(200 / 128) weight-scale rows
    assert bool(((sa >= 0.005) & (sa < 0.025)).all()) and bool(((sb >= 0.005) & (sb < 0.025)).all())
    idx = grouped_contiguous_operands([3, 0, 130], 200, 256, tail=2, stray=True)[0]
    assert idx.tolist() == [0] * 3 + [6] * 125 + [2] * 130 + [6] * 126 + [-1] * 2  # padding index G + 3


def test_moe_masked_operands():
    from mate.testing.inputs import moe_masked_operands

    a, sa, b, sb, masked_m = moe_masked_operands(3, 64, 32, 200, 256, "cpu")
    assert a.shape == (3, 64, 256) and a.dtype == torch.float8_e4m3fn and sa.shape == (3, 64, 2)
    assert b.shape == (3, 200, 256) and sb.shape == (3, 2, 2) and masked_m.dtype == torch.int32
    assert bool(((masked_m >= 16) & (masked_m <= 48)).all())
    assert torch.equal(masked_m, moe_masked_operands(3, 64, 32, 200, 256, "cpu")[4])  # seeded
