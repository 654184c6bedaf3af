"""Backend selection: Triton kernels on CUDA, the PyTorch reference on the CPU.

``MATE_BACKEND`` (``auto`` | ``triton`` | ``reference``) overrides the choice, read at
each call so tests and users can switch it. ``triton`` on CPU tensors is legal only under
Triton's interpreter (``TRITON_INTERPRET=1``), which is how CI exercises the kernels.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

Backend = Literal["triton", "reference"]
BACKEND_CHOICES = ("auto", "triton", "reference")

__all__ = ["Backend", "BACKEND_CHOICES", "interpreter_active", "requested_backend", "select_backend"]


def interpreter_active() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def requested_backend() -> str:
    value = os.environ.get("MATE_BACKEND", "auto").strip().lower() or "auto"
    if value not in BACKEND_CHOICES:
        raise ValueError(f"MATE_BACKEND must be one of {BACKEND_CHOICES}, got {value!r}")
    return value


def select_backend(device: torch.device, override: str | None = None) -> Backend:
    """Picks ``"triton"`` or ``"reference"`` for tensors on ``device``.

    ``override`` (an op's own ``backend`` argument, when it has the same meaning) wins over
    ``MATE_BACKEND``.
    """
    choice = override if override not in (None, "auto") else requested_backend()
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {BACKEND_CHOICES}, got {choice!r}")
    if choice == "reference":
        return "reference"
    if device.type == "cuda":
        return "triton"
    if choice == "triton":
        if interpreter_active():
            return "triton"
        source = "backend='triton'" if override not in (None, "auto") else "MATE_BACKEND=triton"
        raise ValueError(
            f"{source} on CPU tensors requires Triton's interpreter "
            "(set TRITON_INTERPRET=1 before importing triton), got a CPU device without it"
        )
    return "reference"
