"""Every example in examples/ runs on the CPU (reference backend) and checks itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The tensor-parallel example needs torchrun with several ranks: tests/sparse_mla/test_tp_example.py runs it.
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name != "tp_sparse_mla_decode.py")


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_on_cpu(script: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MATE_BACKEND", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "ok" in proc.stdout.lower()
