"""Shared pytest markers of the test suite."""

from __future__ import annotations

import pytest
import torch

interpreter_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs Triton kernels on CPU tensors, which needs the interpreter (set only where no GPU is present)")
