"""group_deepgemm_fp8_nt_groupwise (contiguous MoE layout) and batch_deepgemm_fp8_nt_groupwise
(masked MoE layout): Triton kernel under the interpreter, edges and errors."""

from __future__ import annotations

import pytest
import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.testing import assert_close, poisoned, rand_fp8

# bf16 output of an fp32 accumulation (order differs from the reference): one bf16
# rounding, covered by the default bf16 tolerance.


def _experts(G, n, k, device):
    b = rand_fp8((G, n, k), device=device, scale=2.0)
    b_scale = torch.rand(G, -(-n // 128), k // 128, device=device) * 0.02 + 0.005
    return b, b_scale


def _contiguous_indices(rows_per_group, device):
    """Each group's rows start at a multiple of 128, padded with -1 up to the next multiple."""
    idx = []
    for g, r in enumerate(rows_per_group):
        if r == 0:
            continue
        padded = -(-r // 128) * 128
        idx += [g] * r + [-1] * (padded - r)
    return torch.tensor(idx, dtype=torch.int32, device=device)


def test_alignment():
    assert gemm.get_m_alignment_for_contiguous_layout() == 128


@pytest.mark.parametrize("n", [128, 200])
def test_contiguous_triton(device, triton_backend, n):
    G, k = 3, 256
    idx = _contiguous_indices([70, 0, 130], device)  # group 1 empty; -1 padding rows; two tiles for group 2
    m = idx.numel()
    a = rand_fp8((m, k), device=device, scale=2.0)
    a_scale = torch.rand(m, k // 128, device=device) * 0.02 + 0.005
    b, b_scale = _experts(G, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    res = gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, idx, out=out)
    assert res is out
    ref = R.grouped_contiguous_ref(a, b, a_scale, b_scale, idx, torch.float32)
    valid = idx >= 0
    assert_close(out[valid], ref[valid])
    assert bool(torch.isnan(out[~valid].float()).all())  # padding rows are not written


def test_contiguous_reference_cpu_and_check_inputs(monkeypatch):
    idx = _contiguous_indices([5, 3], "cpu")
    m, k = idx.numel(), 128
    a = rand_fp8((m, k))
    a_scale = torch.rand(m, 1) + 0.5
    b, b_scale = _experts(2, 128, k, "cpu")
    out = gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, idx)
    ref = R.grouped_contiguous_ref(a, b, a_scale, b_scale, idx, torch.float32)
    assert_close(out[idx >= 0], ref[idx >= 0])
    monkeypatch.setenv("MATE_CHECK_INPUTS", "1")
    gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, idx)  # a valid layout passes
    bad = idx.clone()
    bad[0], bad[130] = 1, 0  # group 0 is split in two ranges
    with pytest.raises(ValueError, match="m_indices must give each group one contiguous row range"):
        gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, bad)
    bad = idx.clone()
    bad[3] = 2
    with pytest.raises(ValueError, match="m_indices must be values in"):
        gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, bad)


def test_contiguous_out_of_range_index_skipped(device, triton_backend):
    """An index >= G (a violated precondition) is skipped by the kernel, never read out of bounds."""
    k, n = 128, 128
    idx = torch.full((128,), 5, dtype=torch.int32, device=device)
    a = rand_fp8((128, k), device=device)
    a_scale = torch.ones(128, 1, device=device)
    b, b_scale = _experts(2, n, k, device)
    out = poisoned((128, n), torch.bfloat16, device)
    gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, idx, out=out)
    assert bool(torch.isnan(out.float()).all())
    # beside valid rows of the same 128-row tile: those rows are still computed
    idx = torch.tensor([0] * 100 + [5] * 28 + [1] * 128, dtype=torch.int32, device=device)
    a = rand_fp8((256, k), device=device)
    a_scale = torch.rand(256, 1, device=device) + 0.5
    out = poisoned((256, n), torch.bfloat16, device)
    gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, idx, out=out)
    ref = R.grouped_contiguous_ref(a, b, a_scale, b_scale, idx, torch.float32)
    valid = idx < 2
    assert_close(out[valid], ref[valid])
    assert bool(torch.isnan(out[~valid].float()).all())


@pytest.mark.parametrize("expected_m", [16, 100])  # 64-row and 128-row tiles
def test_masked_triton(device, triton_backend, expected_m):
    G, max_m, n, k = 3, 96, 136, 256
    a = rand_fp8((G, max_m, k), device=device, scale=2.0)
    a_scale = torch.rand(G, max_m, k // 128, device=device) * 0.02 + 0.005
    b, b_scale = _experts(G, n, k, device)
    masked_m = torch.tensor([0, max_m, 37], dtype=torch.int32, device=device)  # empty, full, partial
    out = poisoned((G, max_m, n), torch.bfloat16, device)
    res = gemm.batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, masked_m, expected_m, out=out)
    assert res is out
    ref = R.masked_ref(a, b, a_scale, b_scale, masked_m, torch.float32)
    assert_close(out[1], ref[1])
    assert_close(out[2, :37], ref[2, :37])
    assert bool(torch.isnan(out[0].float()).all())  # masked_m 0: nothing written
    assert bool(torch.isnan(out[2, 64:].float()).all())  # whole tiles past masked_m skipped


def test_masked_reference_cpu_and_check_inputs(monkeypatch):
    G, max_m, n, k = 2, 4, 128, 128
    a = rand_fp8((G, max_m, k))
    a_scale = torch.rand(G, max_m, 1) + 0.5
    b, b_scale = _experts(G, n, k, "cpu")
    masked_m = torch.tensor([4, 1], dtype=torch.int32)
    out = gemm.batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, masked_m, 2)
    ref = R.masked_ref(a, b, a_scale, b_scale, masked_m, torch.float32)
    assert_close(out[0], ref[0])
    assert_close(out[1, :1], ref[1, :1])
    monkeypatch.setenv("MATE_CHECK_INPUTS", "1")
    with pytest.raises(ValueError, match="masked_m must be values in"):
        gemm.batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, torch.tensor([5, 0], dtype=torch.int32), 2)


def _error_operands():
    """Small valid operands of both MoE layouts (2 experts, 128 rows, n 128, k 256) for the error tests."""
    G, m, n, k = 2, 128, 128, 256
    b, b_scale = _experts(G, n, k, "cpu")
    return G, m, n, k, rand_fp8((m, k)), torch.ones(m, 2), b, b_scale, torch.zeros(m, dtype=torch.int32)


def test_grouped_errors():
    G, m, n, k, a, a_scale, b, b_scale, idx = _error_operands()
    f = gemm.group_deepgemm_fp8_nt_groupwise
    with pytest.raises(TypeError, match="m_indices must be torch.int32"):
        f(a, b, a_scale, b_scale, idx.long())
    with pytest.raises(ValueError, match="b_scale must have shape"):
        f(a, b, a_scale, b_scale[:, :, :1].contiguous(), idx)
    with pytest.raises(ValueError, match="a must have shape"):
        f(a[:, :128].contiguous(), b, a_scale, b_scale, idx)
    with pytest.raises(ValueError, match="scale_granularity_mnk"):
        f(a, b, a_scale, b_scale, idx, scale_granularity_mnk=(128, 128, 128))
    with pytest.raises(ValueError, match="out_dtype"):
        f(a, b, a_scale, b_scale, idx, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="a and b must not both be torch.float8_e5m2"):
        f(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2), a_scale, b_scale, idx)
    g = gemm.batch_deepgemm_fp8_nt_groupwise
    a3, s3 = a.view(G, 64, k), a_scale.view(G, 64, 2)
    mm = torch.full((G,), 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="expected_m must be a positive int"):
        g(a3, b, s3, b_scale, mm, 0)
    with pytest.raises(TypeError, match="expected_m must be an int"):
        g(a3, b, s3, b_scale, mm, 2.5)
    with pytest.raises(ValueError, match="masked_m must have shape"):
        g(a3, b, s3, b_scale, mm[:1], 8)
    with pytest.raises(ValueError, match="b must have shape"):
        g(a3[:1], b, s3[:1], b_scale, mm, 8)


def test_grouped_more_errors():
    """The rest of the spec's error cases of both MoE layouts (types, shapes, k, devices)."""
    G, m, n, k, a, a_scale, b, b_scale, idx = _error_operands()
    f = gemm.group_deepgemm_fp8_nt_groupwise
    with pytest.raises(TypeError, match="b must be one of"):
        f(a, b.float(), a_scale, b_scale, idx)
    with pytest.raises(TypeError, match="a_scale must be torch.float32"):
        f(a, b, a_scale.half(), b_scale, idx)
    with pytest.raises(ValueError, match="out must have shape"):
        f(a, b, a_scale, b_scale, idx, out=torch.empty(m, n + 1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out must be"):
        f(a, b, a_scale, b_scale, idx, out=torch.empty(m, n, dtype=torch.float32))
    with pytest.raises(ValueError, match="k \\(the last dimension of a and b\\) must be a positive multiple of 128"):
        f(a[:, :200].contiguous(), b[:, :, :200].contiguous(), a_scale, b_scale, idx)
    with pytest.raises(ValueError, match="must be on cpu"):
        f(a, b, a_scale, b_scale, idx.to("meta"))
    g = gemm.batch_deepgemm_fp8_nt_groupwise
    a3, s3 = a.view(G, 64, k), a_scale.view(G, 64, 2)
    mm = torch.full((G,), 64, dtype=torch.int32)
    with pytest.raises(TypeError, match="masked_m must be torch.int32"):
        g(a3, b, s3, b_scale, mm.long(), 8)
    with pytest.raises(ValueError, match="a_scale must have shape"):
        g(a3, b, s3[:, :32].contiguous(), b_scale, mm, 8)
    with pytest.raises(ValueError, match="out must have shape"):
        g(a3, b, s3, b_scale, mm, 8, out=torch.empty(G, 64, n + 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out_dtype"):
        g(a3, b, s3, b_scale, mm, 8, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="a and b must not both be torch.float8_e5m2"):
        g(a3.to(torch.float8_e5m2), b.to(torch.float8_e5m2), s3, b_scale, mm, 8)


def test_contiguous_without_experts(device, triton_backend):
    """G = 0: every row is padding; nothing is written (the kernel's descriptors need G > 0)."""
    m, n, k = 128, 128, 128
    a = rand_fp8((m, k), device=device)
    a_scale = torch.rand(m, 1, device=device) + 0.5
    b, b_scale = _experts(0, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    idx = torch.full((m,), -1, dtype=torch.int32, device=device)
    assert gemm.group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, idx, out=out) is out
    assert bool(torch.isnan(out.float()).all())


def test_scale_granularity_must_be_a_triple():
    idx = _contiguous_indices([5], "cpu")
    a = rand_fp8((idx.numel(), 128))
    b, b_scale = _experts(1, 128, 128, "cpu")
    with pytest.raises(ValueError, match=r"scale_granularity_mnk must be \(1, 128, 128\), got 128"):
        gemm.group_deepgemm_fp8_nt_groupwise(a, b, torch.ones(idx.numel(), 1), b_scale, idx, scale_granularity_mnk=128)
