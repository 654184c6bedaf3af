"""Root pytest configuration.

Without a CUDA GPU, Triton kernels run under Triton's interpreter: ``TRITON_INTERPRET``
must be set before anything imports triton, so it is set here, first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where kernels run: the GPU when present, else the CPU under Triton's interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def triton_backend(monkeypatch):
    """Forces the Triton kernels (on CPU tensors they run under the interpreter)."""
    monkeypatch.setenv("MATE_BACKEND", "triton")
    return "triton"


@pytest.fixture
def reference_backend(monkeypatch):
    monkeypatch.setenv("MATE_BACKEND", "reference")
    return "reference"
