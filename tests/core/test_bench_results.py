"""Merging benchmark runs of one session (``benchmarks/run_gpu.py --merge``) and the README
table made from the result (``benchmarks/update_readme.py``): each row keeps the ceilings of
the run that measured it, and both outputs name each run's families and ceilings."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"date": "2026-11-29", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6"}


def _run(family: str, copy: float, fp8: float) -> dict:
    time_us = random.uniform(5.0, 50.0)
    row = {"family": family, "op": "op", "shape": f"{family} shape", "dtype": "e4m3", "impl": "mate",
           "time_us": time_us, "frac_ceiling": random.random(), "ceiling": "copy_GBps", "GBps": copy / 2}
    return {"env": ENV, "ceilings": {"copy_GBps": copy, "cublas_fp8_TFLOPs": fp8}, "tests": None, "rows": [row]}


def test_merge_keeps_each_runs_ceilings(tmp_path):
    first, second = _run("sparse_mla", 4237.0, 1437.0), _run("gemm", 4260.0, 1469.0)
    paths = []
    for i, run in enumerate((first, second)):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_gpu.py"), "--merge", *map(str, paths)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    payload = json.loads((out / "2026-11-29-h200.json").read_text())
    assert payload["rows"] == first["rows"] + second["rows"]
    assert payload["runs"] == [{"families": ["sparse_mla"], "ceilings": first["ceilings"]},
                               {"families": ["gemm"], "ceilings": second["ceilings"]}]
    md = (out / "2026-11-29-h200.md").read_text()
    assert "| 1 | sparse_mla | 4237.0 | 1437.0 |" in md and "| 2 | gemm | 4260.0 | 1469.0 |" in md

    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "benchmarks" / "update_readme.py")
    readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme)
    text = readme.condensed(payload, "2026-11-29-h200")
    assert ("Ceilings, measured in the run of each row (runs in the order of the full table): run 1 (sparse_mla): "
            "copy_GBps = 4237, cublas_fp8_TFLOPs = 1437; run 2 (gemm): copy_GBps = 4260, cublas_fp8_TFLOPs = 1469.") \
        in text
    # one run: the single ceilings line
    single = readme.condensed({**first, "runs": None}, "x")
    assert "Ceilings in the same run: copy_GBps = 4237, cublas_fp8_TFLOPs = 1437." in single


def test_update_replaces_rows_and_marks_their_run(tmp_path):
    base = _run("sparse_mla", 4237.0, 1437.0)
    extra = {**base["rows"][0], "impl": "FlashMLA", "time_us": 99.0}
    other = {**base["rows"][0], "shape": "other shape"}
    base["rows"] += [extra, other]
    base["runs"] = [{"families": ["sparse_mla"], "ceilings": base["ceilings"]}]
    new = _run("sparse_mla", 4260.0, 1469.0)  # the same case as base's first row, mate only
    added = {**new["rows"][0], "impl": "mate variant"}
    new["rows"].append(added)
    gemm = _run("gemm", 4260.0, 1469.0)
    new["rows"] += gemm["rows"]
    paths = [tmp_path / "base.json", tmp_path / "new.json"]
    for p, payload in zip(paths, (base, new)):
        p.write_text(json.dumps(payload))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_gpu.py"), "--merge", *map(str, paths),
                           "--update"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    payload = json.loads((out / "2026-11-29-h200.json").read_text())
    # replaced in place, a new implementation after its case's last row, the base's other rows kept, a new
    # family at the end
    assert payload["rows"] == [{**new["rows"][0], "run": 2}, extra, {**added, "run": 2}, other,
                               {**gemm["rows"][0], "run": 2}]
    assert payload["runs"] == [{"families": ["sparse_mla"], "ceilings": base["ceilings"]},
                               {"families": ["sparse_mla", "gemm"], "ceilings": new["ceilings"]}]
    md = (out / "2026-11-29-h200.md").read_text()
    assert md.count("| run 2") == 3
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "benchmarks" / "update_readme.py")
    readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme)
    text = readme.condensed(payload, "2026-11-29-h200")
    assert "a row marked with a run was measured in that run" in text and "(run 2)" in text
