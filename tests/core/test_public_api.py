"""Guards the conventions every public op follows (docs/developing.md): each public
function of the interface modules is wrapped by ``mate_api``, fully type-hinted and has a
NumPy-style docstring. ``mate_api`` wraps only when ``MATE_LOGLEVEL`` > 0 at import, so the
modules are inspected in a subprocess with logging on (to a file nobody reads)."""

from __future__ import annotations

import json

INTERFACES = ["mate.sparse_mla_interface", "mate.msa_interface", "mate.mha_interface", "mate.gemm"]

INSPECT = """
import importlib, inspect, json, sys
problems, seen = [], []
for name in INTERFACES:
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            continue  # that family has not landed
        raise
    public = getattr(mod, "__all__", None)
    if public is None:  # no __all__: the public functions defined in the module
        public = [n for n, o in vars(mod).items() if not n.startswith("_") and inspect.isfunction(o)
                  and inspect.unwrap(o).__module__ == name]
    for attr in public:
        obj = getattr(mod, attr)
        if attr.startswith("_") or not inspect.isfunction(obj):
            continue  # classes (plans, metadata) and private helpers
        where = f"{name}.{attr}"
        seen.append(where)
        if not getattr(obj, "__mate_api__", False):
            problems.append(f"{where}: not decorated with mate_api")
        fn = inspect.unwrap(obj)
        sig = inspect.signature(fn)
        bare = [p for p, v in sig.parameters.items() if v.annotation is inspect.Parameter.empty]
        if bare:
            problems.append(f"{where}: parameters without type hints: {bare}")
        if sig.return_annotation is inspect.Signature.empty:
            problems.append(f"{where}: no return type hint")
        doc = inspect.getdoc(fn) or ""
        need = (["Parameters"] if sig.parameters else []) + ["Returns"]
        missing = [s for s in need if s not in doc]
        if missing:
            problems.append(f"{where}: docstring without the NumPy sections {missing}")
print(json.dumps({"seen": seen, "problems": problems}))
"""


def test_public_functions_follow_the_conventions(run_py, tmp_path):
    proc = run_py(f"INTERFACES = {INTERFACES!r}\n" + INSPECT, MATE_LOGLEVEL="1",
                  MATE_LOGDEST=str(tmp_path / "log.txt"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["seen"], "no public function found: the inspection is broken"
    assert not result["problems"], "\n".join(result["problems"])


def test_import_mate_is_light_and_exposes_the_modules(run_py):
    """``import mate`` loads no kernel code; each public module is imported on first access."""
    proc = run_py("import sys, mate\n"
                  "print(any(m.startswith('mate.') for m in sys.modules), 'triton' in sys.modules)\n"
                  "print(mate.gemm.bmm_fp8.__module__, mate.sparse_mla_interface.__name__, mate.msa_interface.__name__,"
                  " mate.mha_interface.__name__)\n"
                  "print(hasattr(mate, 'nothing'))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "mate.gemm", "mate.sparse_mla_interface", "mate.msa_interface",
                                   "mate.mha_interface", "False"]
