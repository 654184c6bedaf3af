"""Scratch buffers of the MSA sparse forward, owned by a plan (no Triton import here).

The sparse forward needs small device work buffers per call: the per-tile union of the
selected blocks (page, block id, token bit mask, count), each token's position and KV
length, the split-decode partial outputs and, when the caller wants no LSE, a scratch
LSE. A plan owns one :class:`MsaWorkspace`; the first call on a device allocates its
buffers sized by the plan's capacities (a static plan: ``batch_size * max_seqlen_q``
query rows), and every later call slices the same storage, so a static plan executes
with no allocation and can be captured in a CUDA graph after one warm-up call. It also holds
the launch recipes of the plan's eager calls (one per call signature).
"""

from __future__ import annotations

import torch

from mate._core.recipe import RecipeCache

__all__ = ["MsaWorkspace"]


class MsaWorkspace:
    """Grow-only pool of flat named device buffers.

    ``buffer(name, numel, dtype, device)`` returns the first ``numel`` elements of the
    buffer ``name``; it allocates only when the buffer is missing, on another device, of
    another dtype, or smaller than ``numel`` (then it is replaced by one of exactly
    ``numel`` elements). ``allocations`` counts those allocations (tests use it to check
    that a plan's calls reuse the storage).
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}
        self.allocations = 0
        self._recipes: RecipeCache | None = None

    @property
    def recipes(self) -> RecipeCache:
        """Launch recipes of the plan's eager calls (:mod:`mate._core.recipe`)."""
        if self._recipes is None:
            self._recipes = RecipeCache()
        return self._recipes

    def buffer(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = max(1, int(numel))
        buf = self._bufs.get(name)
        if buf is None or buf.device != torch.device(device) or buf.dtype != dtype or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._bufs[name] = buf
            self.allocations += 1
        return buf[:numel]

    def data_ptrs(self) -> dict[str, int]:
        """Start address of every buffer (for reuse checks)."""
        return {name: buf.data_ptr() for name, buf in self._bufs.items()}

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}={b.numel()}x{str(b.dtype).removeprefix('torch.')}" for n, b in self._bufs.items())
        return f"MsaWorkspace({sizes})"
