"""Runs an sm_90 build script in a child process (the CPU suite runs under Triton's interpreter,
which cannot compile for a GPU target)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sm90_build_reports(script: str, *args: str, timeout: float = 600) -> list[dict]:
    """Runs ``python -c script *args`` without ``TRITON_INTERPRET``, the repository first on the
    path, and returns the JSON object of each line it printed; fails the test with the end of
    its stderr when it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line) for line in res.stdout.strip().splitlines()]
