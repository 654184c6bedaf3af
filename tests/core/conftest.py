"""Fixtures for the foundation tests: Python subprocesses with a chosen environment (the
logging configuration is read once, at import of ``mate.api_logging``) and one dump of
real calls shared by the dump, replay and CLI tests."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The current environment without any MATE_* variable, with ``_demo_ops`` and the
    repository importable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=subprocess_env(env), capture_output=True, text=True, timeout=180)


@pytest.fixture
def run_py(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_py(code, **env)``: runs ``code`` with ``python -c`` in ``tmp_path``."""

    def run(code: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        return _run([sys.executable, "-c", textwrap.dedent(code)], cwd or tmp_path, env)

    return run


@pytest.fixture
def run_mate(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_mate(*args, **env)``: runs ``python -m mate args...`` in ``tmp_path``."""

    def run(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        return _run([sys.executable, "-m", "mate", *args], cwd or tmp_path, env)

    return run


DEMO_CALLS = """
import os, torch, _demo_ops
from mate.testing import poisoned
x = torch.randn(4, 6)
r1 = _demo_ops.scale_rows(x, 2.0)
# strided input; outputs = two views of one merged byte buffer (fp8 part + bf16 part)
big = torch.randn(8, 12) * 200
xs = big[::2]
buf = poisoned((4, 16), torch.uint8)
q, r = buf[:, :8].view(torch.float8_e4m3fn), buf[:, 8:].view(torch.bfloat16)
r2 = _demo_ops.split_quantize(xs, q, r, scale=3.0)
# strided output given with out=
out = poisoned((6, 8), torch.float32)[:, 2:6]
r3 = _demo_ops.scale_rows(x.t(), -1.5, out=out)
try:
    _demo_ops.scale_rows(torch.ones(2, 2, dtype=torch.int32), 1.0)
except TypeError as exc:
    print("raised:", exc)
# clones: torch.save refuses two views of one storage with different dtypes
torch.save({"r1": r1, "q": q.clone(), "r": r.clone(), "r3": r3, "x": x, "xs": xs}, "expected.pt")
print("pid", os.getpid())
"""


def _shared_run(tmp_path_factory, name: str, code: str, env: dict[str, str]) -> tuple[Path, dict]:
    """Runs ``code`` once per test session in the folder ``name`` (relative paths in
    ``env`` values are relative to it): the pytest-xdist workers share the folder, which
    sits in their common base temporary directory, guarded by a file lock. Returns the
    folder and ``{"stdout", "stderr"}`` of the run."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this run
    work = base / name
    work.mkdir(exist_ok=True)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (work / "result.json").exists():
            proc = _run([sys.executable, "-c", code], work, {k: str(work / v) if k in _PATH_VARS else v
                                                              for k, v in env.items()})
            assert proc.returncode == 0, proc.stderr
            (work / "result.json").write_text(json.dumps({"stdout": proc.stdout, "stderr": proc.stderr}))
        result = json.loads((work / "result.json").read_text())
    return work, result


_PATH_VARS = ("MATE_DUMP_DIR",)


@pytest.fixture(scope="session")
def demo_dump(tmp_path_factory) -> dict:
    """Four real calls of ``_demo_ops`` dumped at MATE_LOGLEVEL=10 (one raising), under
    ``root``; read-only for tests (copy before tampering)."""
    work, result = _shared_run(tmp_path_factory, "core_demo_dump", DEMO_CALLS,
                               {"MATE_LOGLEVEL": "10", "MATE_DUMP_DIR": "dumps", "MATE_LOGDEST": "stderr"})
    pid = int(result["stdout"].split("pid ")[1].split()[0])
    return {**result, "pid": pid, "root": work / "dumps", "work": work}


RUN_MLA_ROPE = """
import os, torch
from mate.sparse_mla_interface import mla_rope_quantize_fp8
from mate.testing import poisoned
dev = os.environ.get("DEMO_DEVICE", "cpu")
nnz, H = 5, 2
bf = torch.bfloat16
q_rope, k_rope = torch.randn(nnz, H, 64, device=dev).to(bf), torch.randn(nnz, 64, device=dev).to(bf)
q_nope, k_nope = torch.randn(nnz, H, 512, device=dev).to(bf), torch.randn(nnz, 512, device=dev).to(bf)
cache = torch.randn(32, 64, device=dev)
pos = torch.randint(0, 32, (nnz,), dtype=torch.int32, device=dev)
q = poisoned((nnz, H, 576), torch.float8_e4m3fn, device=dev)
k = poisoned((nnz, 576), torch.float8_e4m3fn, device=dev)
outs = mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=False, quant_scale_q=4.0,
                             quant_scale_kv=0.5, q_rope_out=q[..., 512:], k_rope_out=k[:, 512:],
                             q_nope_out=q[..., :512], k_nope_out=k[:, :512])
assert outs[0].data_ptr() == q[..., 512:].data_ptr() and not torch.isnan(q.float()).any()
torch.save({"q": q, "k": k}, "merged.pt")
"""


@pytest.fixture(scope="session")
def mla_rope_dump(tmp_path_factory) -> Path:
    """One ``mla_rope_quantize_fp8`` call (reference backend) dumped under ``d``, its
    outputs being views of merged buffers saved in ``merged.pt``."""
    pytest.importorskip("mate.sparse_mla_interface")
    work, _ = _shared_run(tmp_path_factory, "core_mla_rope_dump", RUN_MLA_ROPE,
                          {"MATE_LOGLEVEL": "10", "MATE_DUMP_DIR": "d", "MATE_LOGDEST": "stderr",
                           "MATE_BACKEND": "reference"})
    return work


@pytest.fixture
def fake(monkeypatch):
    """A stand-in JIT kernel on the fast launch path (CPU tensors, device 0, stream 1234)."""
    import torch

    from mate._core import launch as L
    from tests.core._fake_triton import FakeJIT

    # the launcher's view only: TRITON_INTERPRET itself stays, or a module first imported during
    # the test would get compiled-mode kernels for the rest of the session
    monkeypatch.setattr(L, "interpreter_active", lambda: False)
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    return FakeJIT()
