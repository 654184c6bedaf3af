"""The ``mate`` command: check, show-config, env, list-dumps, replay, bench."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WRAPPER_DIST = "flashinfer-python"
WRAPPER_VERSION = "0.6.17+mate"

_TINY_KERNEL = """
import torch, triton, triton.language as tl
@triton.jit
def _k(x, y, n, B: tl.constexpr):
    o = tl.arange(0, B)
    m = o < n
    tl.store(y + o, tl.load(x + o, mask=m) * 2, mask=m)
dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.arange(8, dtype=torch.float32, device=dev)
y = torch.empty_like(x)
_k[(1,)](x, y, 8, B=8)
assert torch.equal(y.cpu(), x.cpu() * 2), y
print("ok")
"""


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                    "memory_GiB": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count})
    return out


def _tiny_kernel(interpret: bool) -> tuple[bool, str]:
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    import tempfile

    # Triton reads a kernel's source from its file: the probe has to be a real .py file.
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "mate_check_kernel.py"
        probe.write_text(_TINY_KERNEL)
        proc = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    ok = proc.returncode == 0 and "ok" in proc.stdout
    return ok, (proc.stderr.strip().splitlines() or ["?"])[-1] if not ok else "ok"


def cmd_check(args: argparse.Namespace) -> int:
    hard = False
    print(f"python  {platform.python_version()} ({sys.executable})")
    try:
        import torch
    except Exception as exc:  # a hard error: nothing runs without torch
        print(f"torch   NOT IMPORTABLE: {exc}")
        return 1
    print(f"torch   {torch.__version__} (CUDA {torch.version.cuda})")
    try:
        import triton

        print(f"triton  {triton.__version__}")
        has_triton = True
    except Exception as exc:
        print(f"triton  not importable ({exc}): CUDA tensors cannot run mate's kernels")
        has_triton = False
    import mate

    print(f"mate    {mate.__version__}")
    gpus = _gpus()
    if not gpus:
        print("gpu     none: no CUDA GPU is visible. This is a CPU-only machine: CPU tensors run the "
              "PyTorch reference; Triton kernels run only under TRITON_INTERPRET=1 (slow, for testing).")
        if has_triton:
            ok, msg = _tiny_kernel(interpret=True)
            print(f"kernel  interpreter run of a tiny Triton kernel: {'ok' if ok else 'FAILED: ' + msg}")
    else:
        for g in gpus:
            note = "" if g["capability"] == "9.0" else " (mate's kernels are tuned for Hopper, sm_90)"
            print(f"gpu {g['index']}   {g['name']}, compute capability {g['capability']}, "
                  f"{g['memory_GiB']} GiB, {g['sms']} SMs{note}")
        if has_triton:
            ok, msg = _tiny_kernel(interpret=False)
            print(f"kernel  compile + run of a tiny Triton kernel: {'ok' if ok else 'FAILED: ' + msg}")
            hard = hard or not ok
    wrapper = _version(WRAPPER_DIST)
    if wrapper is None:
        print(f"wrapper {WRAPPER_DIST} not installed (optional: pip install -e wrappers/flashinfer)")
    elif wrapper != WRAPPER_VERSION:
        print(f"wrapper {WRAPPER_DIST} {wrapper} installed: NOT mate's wrapper ({WRAPPER_VERSION}); "
              "the `flashinfer` import is upstream FlashInfer")
    else:
        print(f"wrapper {WRAPPER_DIST} {wrapper}: flashinfer calls run on mate")
    return 1 if hard else 0


def _config() -> dict[str, Any]:
    import torch

    from mate._core.dispatch import interpreter_active, requested_backend
    from mate._core.env import env_in_effect

    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    import mate

    cuda = torch.cuda.is_available()
    try:
        requested = requested_backend()
    except ValueError as exc:  # a diagnostic command reports a bad MATE_BACKEND, it does not crash
        requested = os.environ.get("MATE_BACKEND", "")
        picks = f"none: {exc}"
    else:
        if requested == "auto":
            picks = "triton (CUDA tensors)" if cuda else "reference (CPU tensors)"
        else:
            picks = requested
    return {
        "mate": mate.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "flashinfer_wrapper": _version(WRAPPER_DIST),
        "gpus": _gpus(),
        "backend_requested": requested,
        "backend_auto_picks": picks,
        "triton_interpreter": interpreter_active(),
        "triton_cache_dir": _triton_cache_dir(),
        "dump_dir": str(Path(os.environ.get("MATE_DUMP_DIR", "mate_dumps")).resolve()),
        "env": env_in_effect(),
    }


def cmd_show_config(args: argparse.Namespace) -> int:
    cfg = _config()
    if args.json:
        print(json.dumps(cfg, indent=2))
        return 0
    for key, value in cfg.items():
        if key == "env":
            print("env:")
            for k, v in value.items():
                print(f"  {k}={v}")
        else:
            print(f"{key}: {value}")
    return 0


def _triton_cache_dir() -> str:
    """Where Triton caches compiled kernels (TRITON_CACHE_DIR, else under TRITON_HOME or ~)."""
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        home = os.environ.get("TRITON_HOME", str(Path.home()))
        return os.environ.get("TRITON_CACHE_DIR", str(Path(home) / ".triton" / "cache"))


def cmd_env(args: argparse.Namespace) -> int:
    from mate._core.env import ENV_VARS, unknown_mate_vars

    for name, (default, meaning) in ENV_VARS.items():
        value = os.environ.get(name)
        shown = f"{value} (set)" if value is not None else f"{default} (default)"
        print(f"{name}={shown}\n    {meaning}")
    for name in unknown_mate_vars():
        print(f"{name}={os.environ[name]} (set)\n    warning: not a variable mate reads (a typo?)")
    for name in ("TRITON_INTERPRET", "TRITON_CACHE_DIR"):
        print(f"{name}={os.environ.get(name, '(unset)')}")
    return 0


def _call_dirs(path: Path) -> list[Path]:
    if (path / "metadata.json").is_file():
        return [path]
    return sorted(p.parent for p in path.glob("*/metadata.json"))


def cmd_list_dumps(args: argparse.Namespace) -> int:
    root = Path(args.path or os.environ.get("MATE_DUMP_DIR", "mate_dumps"))
    if not root.exists():
        print(f"no dumps: {root} does not exist")
        return 0
    dirs = _call_dirs(root)
    for d in dirs:
        meta = json.loads((d / "metadata.json").read_text())
        err = f"  error: {meta['error']}" if meta.get("error") else ""
        print(f"{d.name}  {meta['function']}  {meta.get('device', '')}  {meta.get('bytes', 0)} B{err}")
    print(f"{len(dirs)} call(s) in {root}")
    return 0


def _load_function(qualname: str):
    module_name, _, attr = qualname.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _compare(out: Any, ref: Any, where: str) -> list[str]:
    import torch

    from mate.testing.numeric import assert_close, assert_equal

    if isinstance(ref, torch.Tensor):
        if not isinstance(out, torch.Tensor):
            return [f"{where}: expected a tensor, got {type(out).__name__}"]
        try:
            if ref.dtype.is_floating_point and ref.element_size() > 1:
                assert_close(out.cpu(), ref.cpu(), name=where)
            else:
                assert_equal(out.cpu(), ref.cpu(), name=where)
        except AssertionError as exc:
            return [str(exc)]
        return []
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(ref):
            return [f"{where}: expected a sequence of {len(ref)}"]
        errs: list[str] = []
        for i, (o, r) in enumerate(zip(out, ref)):
            errs += _compare(o, r, f"{where}[{i}]")
        return errs
    if isinstance(ref, dict):
        if not isinstance(out, dict) or out.keys() != ref.keys():
            return [f"{where}: expected a dict with keys {sorted(map(str, ref))}"]
        return [e for k in ref for e in _compare(out[k], ref[k], f"{where}[{k!r}]")]
    if dataclasses.is_dataclass(ref) and not isinstance(ref, type):
        if type(out) is not type(ref):
            return [f"{where}: expected {type(ref).__name__}, got {type(out).__name__}"]
        return [e for f in dataclasses.fields(ref) if f.compare  # compare=False: scratch, not the value
                for e in _compare(getattr(out, f.name), getattr(ref, f.name), f"{where}.{f.name}")]
    if ref is None or isinstance(ref, (bool, int, float, str)):
        same = out == ref or (isinstance(ref, float) and isinstance(out, float) and ref != ref and out != out)
        return [] if same else [f"{where}: {out!r} != {ref!r}"]
    return []


def cmd_replay(args: argparse.Namespace) -> int:
    import torch

    from mate.api_logging import _tensors_in, restore_tensors

    dirs = _call_dirs(Path(args.dir))
    if not dirs:
        print(f"no dumped calls under {args.dir}")
        return 1
    failed = 0
    for d in dirs:
        meta = json.loads((d / "metadata.json").read_text())
        want = meta.get("device", "cpu")
        device = torch.device("cuda" if want.startswith("cuda") and torch.cuda.is_available() else "cpu")
        inputs = torch.load(d / "inputs.pt", map_location="cpu", weights_only=False)
        args_ = restore_tensors(inputs["args"], device)
        kwargs = restore_tensors(inputs["kwargs"], device)
        fn = _load_function(meta["function"])
        try:
            result = fn(*args_, **kwargs)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error == meta.get("error"):
                print(f"SAME-ERROR {d.name}: {error}")
                continue
            dumped = f" (the dumped call raised {meta['error']})" if meta.get("error") else ""
            print(f"FAIL {d.name}: raised {error}{dumped}")
            failed += 1
            continue
        if meta.get("error"):
            print(f"FAIL {d.name}: the dumped call raised {meta['error']}; the replay returned")
            failed += 1
            continue
        if not args.compare:
            print(f"RAN  {d.name} ({meta['function']} on {device})")
            continue
        dumped = torch.load(d / "outputs.pt", map_location="cpu", weights_only=False)
        errs = _compare(result, dumped["result"], "result")
        live = dict(_tensors_in({"args": args_, "kwargs": kwargs}))
        for path, ref in dumped.get("mutated", {}).items():  # arguments the call wrote in place
            errs += _compare(live.get(path), ref, path.replace("['args']", "arg").replace("['kwargs']", ""))
        if errs:
            failed += 1
            print(f"FAIL {d.name} ({meta['function']} on {device})")
            for e in errs:
                print(f"     {e}")
        else:
            print(f"OK   {d.name} ({meta['function']} on {device})")
    print(f"{len(dirs) - failed} of {len(dirs)} call(s) reproduced")
    return 1 if failed else 0


def _bench_families(bench_dir: Path) -> list[str]:
    """The benchmark modules the GPU runner can run (those with ``run(ceilings, quick)``;
    the others are variant sweeps with their own command lines)."""
    return sorted(p.stem.removeprefix("bench_") for p in bench_dir.glob("bench_*.py")
                  if "\ndef run(ceilings" in p.read_text())


def cmd_bench(args: argparse.Namespace) -> int:
    """Runs one family's benchmark (``benchmarks/bench_<op>.py``) through the GPU runner,
    writing its JSON / Markdown / PNG to ``--out`` (default: a new temporary folder, so the
    committed results are left alone)."""
    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    if not bench_dir.is_dir():
        print("mate bench runs the scripts in benchmarks/ of a source checkout; this installation has none "
              "(clone the repository and run it there)")
        return 1
    have = _bench_families(bench_dir)
    if args.op not in have:
        print(f"no benchmark for {args.op!r}; available: {', '.join(have) or 'none'}")
        return 1
    import torch

    if not torch.cuda.is_available():
        print("mate bench needs a CUDA GPU (benchmarks time the Triton kernels against GPU peers)")
        return 1
    out = args.out or tempfile.mkdtemp(prefix=f"mate_bench_{args.op}_")
    cmd = [sys.executable, str(bench_dir / "run_gpu.py"), "--skip-tests", "--families", args.op]
    if args.shape:
        cmd += ["--shape-filter", ",".join(args.shape)]
    if not args.peers:
        cmd += ["--mate-only"]
    print(f"results go to {out}")
    return subprocess.call(cmd, env={**os.environ, "OUT": out})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mate", description="mate: sparse-attention and FP8 kernels for Hopper")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="check the installation, GPUs and the Triton backend").set_defaults(fn=cmd_check)
    sc = sub.add_parser("show-config", help="versions, backend choice, cache folders, environment")
    sc.add_argument("--json", action="store_true", help="print JSON")
    sc.set_defaults(fn=cmd_show_config)
    sub.add_parser("env", help="every MATE_* variable with its value and meaning").set_defaults(fn=cmd_env)
    ld = sub.add_parser("list-dumps", help="list dumped calls")
    ld.add_argument("path", nargs="?", default=None)
    ld.set_defaults(fn=cmd_list_dumps)
    rp = sub.add_parser("replay", help="re-run dumped calls and compare outputs")
    rp.add_argument("--dir", required=True, help="a dump root or one call's folder")
    rp.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True)
    rp.set_defaults(fn=cmd_replay)
    bp = sub.add_parser("bench", help="run the benchmark of one op family")
    bp.add_argument("op")
    bp.add_argument("--shape", nargs="*", default=None, help="keep rows whose shape contains one of these")
    bp.add_argument("--peers", action="store_true", help="also show the peers (cuBLAS, FlashMLA, ...)")
    bp.add_argument("--out", default=None, help="folder for the JSON / Markdown / PNG (default: a new temporary one)")
    bp.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
