"""Input generators for tests and benchmarks (random data, NaN-poisoned outputs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["randn", "rand_fp8", "poisoned"]


def randn(shape: Sequence[int], dtype: torch.dtype = torch.bfloat16, device="cpu", scale: float = 1.0,
          generator: torch.Generator | None = None) -> torch.Tensor:
    return (torch.randn(tuple(shape), device=device, generator=generator) * scale).to(dtype)


def rand_fp8(shape: Sequence[int], device="cpu", scale: float = 1.0,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Random e4m3 values (normal * scale, saturated to +-448)."""
    x = torch.randn(tuple(shape), device=device, generator=generator) * scale
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def poisoned(shape: Sequence[int], dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """An output buffer filled with NaN (or the dtype's largest value for ints), so that
    an element the kernel fails to write is caught by the comparison."""
    t = torch.empty(tuple(shape), dtype=dtype, device=device)
    if dtype.is_floating_point:
        if t.element_size() == 1:
            # the NaN byte of this 8-bit format (0x7F for e4m3fn/e5m2, 0x80 for the fnuz ones)
            nan_byte = torch.full((), float("nan"), dtype=dtype).view(torch.uint8).item()
            t.view(torch.uint8).fill_(nan_byte)
        else:
            t.fill_(float("nan"))
    elif dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(dtype).max)
    return t
