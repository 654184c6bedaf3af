"""The GPU runner: ceilings, the GPU test suite and every benchmark in one run.

Run on the H200 (through the ``device`` tool) from the repository root::

    python benchmarks/run_gpu.py [--families sparse_mla,gemm] [--skip-tests] [--skip-bench]

1. measures the ceilings in the same run (device copy bandwidth, cuBLAS bf16 and FP8);
2. runs the tests marked ``gpu`` with ``TRITON_INTERPRET`` unset;
3. runs ``benchmarks/bench_<family>.py`` (each has ``run(ceilings, quick) -> rows``);
4. writes JSON, a Markdown table and PNG plots to ``benchmarks/results/`` (or ``$OUT``)
   and prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.pop("TRITON_INTERPRET", None)


def _families() -> list[str]:
    """The benchmark modules with a ``run(ceilings, quick)`` entry point (the others, e.g.
    variant sweeps, are scripts of their own)."""
    return sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py")
                  if "\ndef run(ceilings" in p.read_text())


def _env_with_root() -> dict:
    paths = [str(ROOT), str(ROOT / "wrappers" / "flashinfer"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_tests(out_dir: Path, pytest_args: list[str]) -> dict:
    log = out_dir / "gpu_tests.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--timeout", "300",
           "-o", "addopts=", "-rfE", *pytest_args]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env_with_root())
    log.write_text(proc.stdout + "\n" + proc.stderr)
    tail = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return {"returncode": proc.returncode, "summary": tail[0], "failed": failed[:50], "seconds": time.time() - t0}


def run_benchmarks(families: list[str], ceilings: dict, quick: bool, on_family=None) -> list[dict]:
    rows: list[dict] = []
    from mate.testing.bench import progress

    for fam in progress(families, "benchmark families"):
        path = ROOT / "benchmarks" / f"bench_{fam}.py"
        spec = importlib.util.spec_from_file_location(f"bench_{fam}", path)
        mod = importlib.util.module_from_spec(spec)
        t0 = time.time()
        try:
            spec.loader.exec_module(mod)
            rows += mod.run(ceilings, quick=quick)
        except Exception:
            rows.append({"family": fam, "op": "(benchmark crashed)", "shape": "", "impl": "mate", "time_us": None,
                         "note": traceback.format_exc()[-800:]})
        print(f"[run_gpu] {fam}: {time.time() - t0:.0f} s", flush=True)
        if on_family is not None:
            on_family(rows)
    return rows


def _fmt(v, spec):
    return "" if v is None else format(v, spec)


def markdown(ceilings: dict, tests: dict | None, rows: list[dict], env: dict, runs: list[dict] | None = None) -> str:
    """``runs`` (a merge): each run's families and ceilings; a row's fraction is of its own run's."""
    lines = [f"# mate benchmarks, {env['date']} on {env['gpu']}", "",
             f"torch {env['torch']}, triton {env['triton']}. Times are medians of CUDA-graph replays "
             "over rotated inputs.", ""]
    if runs and len(runs) > 1:
        lines += ["| run | families | " + " | ".join(ceilings) + " |", "| --- " * (len(ceilings) + 2) + "|"]
        lines += [f"| {i + 1} | {', '.join(r['families'])} | " + " | ".join(f"{r['ceilings'].get(k, 0):.1f}"
                                                                           for k in ceilings) + " |"
                  for i, r in enumerate(runs)]
    else:
        lines += ["| ceiling | measured |", "| --- | --- |"]
        lines += [f"| {k} | {v:.1f} |" for k, v in ceilings.items()]
    if tests:
        lines += ["", f"GPU tests: `{tests['summary']}`"]
    lines += ["",
              "| family | op | shape | dtype | impl | time (us) | TFLOP/s | GB/s | fraction of ceiling | note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        frac = f"{r['frac_ceiling']:.0%} of {r['ceiling']}" if r.get("frac_ceiling") is not None else ""
        note = (r.get("note") or "").replace("\n", " ").replace("|", "/")[:120]
        if r.get("run"):  # an updated row: measured in that run (the others in the runs of the base, in order)
            note = f"run {r['run']}; {note}".rstrip("; ")
        lines.append(f"| {r['family']} | {r['op']} | {r['shape']} | {r.get('dtype', '')} | {r['impl']} | "
                     f"{_fmt(r.get('time_us'), '.1f')} | {_fmt(r.get('TFLOPs'), '.1f')} | "
                     f"{_fmt(r.get('GBps'), '.0f')} | {frac} | {note} |")
    return "\n".join(lines) + "\n"


def plots(rows: list[dict], out_dir: Path, stem: str) -> list[Path]:
    """One PNG with a panel per family: time of mate and of each peer per case (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return []
    families = [f for f in dict.fromkeys(r["family"] for r in rows) if any(r.get("time_us") for r in rows
                                                                             if r["family"] == f)]
    if not families:
        return []
    fig, axes = plt.subplots(len(families), 1, figsize=(14, 4.2 * len(families)), squeeze=False)
    for ax, fam in zip(axes[:, 0], families):
        fr = [r for r in rows if r["family"] == fam and r.get("time_us")]
        label = lambda r: f"{r['op']} {r['shape']} {r.get('dtype', '')}".strip()
        cases = list(dict.fromkeys(label(r) for r in fr))
        impls = list(dict.fromkeys(r["impl"] for r in fr))
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            vals = []
            for c in cases:
                match = [r for r in fr if label(r) == c and r["impl"] == impl]
                vals.append(match[0]["time_us"] if match else 0)
            ax.bar([x + i * width for x in range(len(cases))], vals, width, label=impl)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cases))])
        ax.set_xticklabels(cases, rotation=35, ha="right", fontsize=6)
        ax.set_ylabel("time (us), lower is better")
        ax.set_yscale("log")
        ax.set_title(f"mate {fam}")
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    path = out_dir / f"{stem}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default=",".join(_families()))
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, space-separated")
    ap.add_argument("--shape-filter", default="", help="comma-separated substrings: keep rows whose shape has one")
    ap.add_argument("--mate-only", action="store_true", help="drop the peers' rows")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="merge the results of several runs (one session split into calls) into one "
                         "JSON/Markdown/PNG in $OUT or benchmarks/results; no GPU needed")
    ap.add_argument("--update", action="store_true",
                    help="with --merge: the first JSON is the base; each later run's rows replace the base's "
                         "rows of the same case and implementation (or join its family) and are marked with "
                         "their run")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, update=args.update)

    import torch
    import triton

    from mate.testing.bench import measure_ceilings

    out_dir = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0)
    env = {"date": dt.date.today().isoformat(), "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}
    ceilings = measure_ceilings()
    print("[run_gpu] ceilings:", json.dumps({k: round(v, 1) for k, v in ceilings.items()}), flush=True)
    tests = None if args.skip_tests else run_tests(out_dir, args.pytest_args.split())
    if tests:
        print(f"[run_gpu] tests: {tests['summary']} ({tests['seconds']:.0f} s)", flush=True)
    families = [f for f in args.families.split(",") if f]
    stem = f"{env['date']}-{gpu.replace('NVIDIA ', '').replace(' ', '_').lower()}"

    def save(rows_so_far: list[dict]) -> None:  # after each family, so a run cut short keeps its results
        payload = {"env": env, "ceilings": ceilings, "tests": tests, "rows": rows_so_far}
        (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=2))

    rows = [] if args.skip_bench else run_benchmarks(families, ceilings, args.quick, on_family=save)
    if args.shape_filter:
        keep = [s for s in args.shape_filter.split(",") if s]
        rows = [r for r in rows if any(k in r["shape"] for k in keep)]
    if args.mate_only:
        rows = [r for r in rows if r["impl"].startswith("mate")]

    save(rows)
    (out_dir / f"{stem}.md").write_text(markdown(ceilings, tests, rows, env))
    plots(rows, out_dir, stem)

    print("\n" + "=" * 100)
    print("ceilings: " + ", ".join(f"{k}={v:.0f}" for k, v in ceilings.items()))
    if tests:
        print(f"gpu tests: {tests['summary']}")
        for f in tests["failed"][:15]:
            print("  " + f[:160])
    for r in rows:
        frac = f"{r['frac_ceiling']:.0%}" if r.get("frac_ceiling") is not None else ""
        print(f"{r['family'][:10]:10} {r['op'][:22]:22} {r['shape'][:34]:34} {r['impl'][:14]:14} "
              f"{_fmt(r.get('time_us'), '9.1f'):>9} us {_fmt(r.get('TFLOPs'), '7.1f'):>7} TF "
              f"{_fmt(r.get('GBps'), '6.0f'):>6} GB/s {frac:>5} {(r.get('note') or '')[:40]}")
    return 0 if not tests or tests["returncode"] in (0, 5) else 1


def _run_entry(payload: dict) -> dict:
    return {"families": list(dict.fromkeys(row["family"] for row in payload["rows"])), "ceilings": payload["ceilings"]}


def update_rows(base: list[dict], new: list[dict], run: int) -> list[dict]:
    """``base`` with each row of ``new`` (marked ``run``) in place of the base row of the same
    (family, op, shape, dtype, impl), else after the last base row of its (family, op, shape),
    else of its family, else at the end."""
    def key(r, n):
        return tuple(r.get(k, "") for k in ("family", "op", "shape", "dtype", "impl")[:n])

    rows = list(base)
    for r in new:
        r = {**r, "run": run}
        same = [i for i, b in enumerate(rows) if key(b, 5) == key(r, 5)]
        if same:
            rows[same[0]] = r
            continue
        near = [i for i, b in enumerate(rows) if key(b, 3) == key(r, 3)] or \
               [i for i, b in enumerate(rows) if b["family"] == r["family"]]
        rows.insert(near[-1] + 1 if near else len(rows), r)
    return rows


def merge(paths: list[str], update: bool = False) -> int:
    """Rows of every run in order; the GPU test summary of the run that has one; the first
    run's ceilings, the others' kept under ``ceilings_runs``. ``update``: the first file is a
    base (itself a merge or one run) whose rows the later runs' rows replace (:func:`update_rows`);
    their runs are appended to the base's, and their GPU test summary, if any, is kept."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    if update:
        base = runs[0]
        per_run = list(base.get("runs") or [_run_entry(base)])
        rows = base["rows"]
        for r in runs[1:]:
            per_run.append(_run_entry(r))
            rows = update_rows(rows, r["rows"], len(per_run))
        env = {**base["env"], "date": runs[-1]["env"]["date"]}
        tests = next((r["tests"] for r in reversed(runs) if r.get("tests")), None)
        ceilings = base["ceilings"]
    else:
        env, ceilings = runs[0]["env"], runs[0]["ceilings"]
        tests = next((r["tests"] for r in runs if r.get("tests")), None)
        rows = [row for r in runs for row in r["rows"]]
        per_run = [_run_entry(r) for r in runs]
    out_dir = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{env['date']}-{env['gpu'].replace('NVIDIA ', '').replace(' ', '_').lower()}"
    payload = {"env": env, "ceilings": ceilings, "ceilings_runs": [r["ceilings"] for r in per_run], "runs": per_run,
               "tests": tests, "rows": rows}
    (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=2))
    (out_dir / f"{stem}.md").write_text(markdown(ceilings, tests, rows, env, per_run))
    plots(rows, out_dir, stem)
    print(f"merged {len(runs)} runs, {len(rows)} rows -> {out_dir / stem}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
