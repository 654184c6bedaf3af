"""Backend selection (``MATE_BACKEND``; Triton on CPU tensors only under the interpreter)."""

from __future__ import annotations

import pytest
import torch

from mate._core.dispatch import BACKEND_CHOICES, interpreter_active, requested_backend, select_backend

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)  # only the device type is read: no GPU needed


@pytest.fixture
def env(monkeypatch):
    def set_(backend: str | None, interpret: bool) -> None:
        if backend is None:
            monkeypatch.delenv("MATE_BACKEND", raising=False)
        else:
            monkeypatch.setenv("MATE_BACKEND", backend)
        monkeypatch.setenv("TRITON_INTERPRET", "1" if interpret else "0")

    return set_


def test_choices():
    assert BACKEND_CHOICES == ("auto", "triton", "reference")


@pytest.mark.parametrize(
    ("backend", "interpret", "cpu", "cuda"),
    [
        (None, False, "reference", "triton"),
        (None, True, "reference", "triton"),
        ("auto", True, "reference", "triton"),
        ("", False, "reference", "triton"),  # empty means auto
        (" Auto ", False, "reference", "triton"),  # case and spaces ignored
        ("reference", False, "reference", "reference"),
        ("REFERENCE", True, "reference", "reference"),
        ("triton", True, "triton", "triton"),
    ],
)
def test_select_backend(env, backend, interpret, cpu, cuda):
    env(backend, interpret)
    assert select_backend(CPU) == cpu
    assert select_backend(CUDA) == cuda


def test_triton_on_cpu_needs_the_interpreter(env):
    env("triton", False)
    assert select_backend(CUDA) == "triton"
    with pytest.raises(ValueError, match=r"^MATE_BACKEND=triton on CPU tensors requires .*TRITON_INTERPRET=1"):
        select_backend(CPU)
    env("auto", False)  # the op's own argument is named instead of the variable
    with pytest.raises(ValueError, match=r"^backend='triton' on CPU tensors requires .*TRITON_INTERPRET=1"):
        select_backend(CPU, "triton")


def test_bad_env_value(env):
    env("cuda", True)
    with pytest.raises(ValueError, match=r"MATE_BACKEND must be one of \('auto', 'triton', 'reference'\), got 'cuda'"):
        requested_backend()
    with pytest.raises(ValueError, match="MATE_BACKEND"):
        select_backend(CPU)


def test_override_wins_over_env(env):
    env("reference", True)
    assert select_backend(CPU, override="triton") == "triton"
    assert select_backend(CUDA, override="triton") == "triton"
    env("triton", True)
    assert select_backend(CPU, override="reference") == "reference"
    # "auto" and None defer to the environment
    assert select_backend(CPU, override="auto") == "triton"
    assert select_backend(CPU, override=None) == "triton"
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'gpu'"):
        select_backend(CPU, override="gpu")


def test_env_read_at_each_call(env):
    env("reference", True)
    assert select_backend(CPU) == "reference"
    env("triton", True)
    assert select_backend(CPU) == "triton"


def test_interpreter_active(env):
    env(None, True)
    assert interpreter_active()
    env(None, False)
    assert not interpreter_active()


def test_fixtures(triton_backend, device):
    assert requested_backend() == triton_backend == "triton"
    # the conftest runs kernels on the CPU only under the interpreter
    assert select_backend(torch.device(device)) == "triton"
