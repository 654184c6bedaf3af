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


@pytest.fixture
def random_seed(request) -> int:
    """A fresh seed for a randomized test, shown in the report when the test fails (so a
    failing case can be drawn again)."""
    import random

    seed = random.randrange(2**31)
    request.node.user_properties.append(("random_seed", seed))
    yield seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seeds = [v for k, v in item.user_properties if k == "random_seed"]
    if report.failed and seeds:
        report.sections.append(("random seed", f"random_seed = {seeds[0]}"))
