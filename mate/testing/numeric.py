"""Numeric comparison used by tests and benchmarks."""

from __future__ import annotations

import torch

__all__ = ["rel_error", "assert_close", "assert_equal", "fp8_mma_on_gpu", "DTYPE_TOL"]

# Elementwise tolerances (atol, rtol) by the output dtype: one or two units of the output
# rounding on top of the accumulation-order differences of fp32 math.
DTYPE_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 2e-3),
    torch.float8_e4m3fn: (0.0, 0.13),
}


def fp8_mma_on_gpu(dtype: torch.dtype, device) -> bool:
    """Whether fp8 products of this dtype and device run on Hopper FP8 tensor cores, whose
    accumulator keeps ~13 mantissa bits (truncating) at each 32-wide k-step, so a 128-wide
    dot product is off by up to ~4 * 2^-13 of its partial sums' magnitude (the interpreter's
    and the references' fp8 products are exact in fp32)."""
    return dtype == torch.float8_e4m3fn and torch.device(device).type == "cuda"


_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (0 when both are zero)."""
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    num = torch.linalg.vector_norm(o - r).item()
    den = torch.linalg.vector_norm(r).item()
    return num / den if den > 0 else num


def assert_equal(out: torch.Tensor, ref: torch.Tensor, name: str = "output") -> None:
    """Bit-exact equality: identical bit patterns (so -0.0 differs from 0.0), except that
    any NaN equals any NaN (NaN payloads and signs differ between backends). Reports the
    first mismatches."""
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != {ref.dtype}"
    o, r = out.detach().cpu(), ref.detach().cpu()
    if o.dtype.is_floating_point:
        bits = _BITS_DTYPE[o.element_size()]
        same = (o.view(bits) == r.view(bits)) | (torch.isnan(o.float()) & torch.isnan(r.float()))
    else:
        same = o == r
    if not bool(same.all()):
        bad = (~same).nonzero()[:5].tolist()
        raise AssertionError(
            f"{name}: {int((~same).sum())} of {same.numel()} elements differ; first at {bad}: "
            f"{[o[tuple(i)].item() for i in bad]} vs {[r[tuple(i)].item() for i in bad]}"
        )


def assert_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float | torch.Tensor | None = None,
    rtol: float | None = None,
    max_rel_error: float | None = None,
    name: str = "output",
) -> None:
    """Every element within ``atol + rtol * |ref|`` (defaults by ``out.dtype``; ``atol`` may be
    a tensor of per-element bounds that broadcasts to ``ref``), no NaN where the reference has
    none, and optionally a bound on the norm-wise relative error.
    """
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    d_atol, d_rtol = DTYPE_TOL.get(out.dtype, (1e-5, 1e-5))
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    if not torch.equal(nan_o, nan_r):
        raise AssertionError(
            f"{name}: NaN pattern differs ({int(nan_o.sum())} NaN in output, {int(nan_r.sum())} in reference)"
        )
    inf_r = torch.isinf(r)
    if not torch.equal(o[inf_r], r[inf_r]):
        raise AssertionError(f"{name}: infinities differ from the reference")
    fin = ~(nan_r | inf_r)
    diff = (o[fin] - r[fin]).abs()
    if isinstance(atol, torch.Tensor):
        atol_fin = atol.detach().double().cpu().expand_as(r)[fin]
        atol_text = f"per element (max {atol_fin.max().item() if atol_fin.numel() else 0.0:.3g})"
    else:
        atol_fin, atol_text = atol, f"{atol}"
    bound = atol_fin + rtol * r[fin].abs()
    bad = diff > bound
    if bool(bad.any()):
        idx = fin.nonzero()[bad.nonzero().flatten()[:5]].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {fin.sum().item()} elements outside atol={atol_text}, rtol={rtol}; "
            f"max abs diff {diff.max().item():.4g}; first at {idx}: "
            f"{[o[tuple(i)].item() for i in idx]} vs {[r[tuple(i)].item() for i in idx]}"
        )
    if max_rel_error is not None:
        err = rel_error(out, ref)
        assert err <= max_rel_error, f"{name}: relative error {err:.3g} > {max_rel_error:.3g}"
