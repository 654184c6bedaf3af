"""What the documentation must cover: the public modules of mate and of the flashinfer
wrapper, and their public symbols (shared by tests/test_docs.py and
tests/test_docstring_examples.py)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
FLASHINFER_DIR = ROOT / "wrappers" / "flashinfer" / "flashinfer"

# Modules whose public functions are the library's API: each must be in the API reference,
# and each of their public functions needs the full NumPy sections and a runnable example.
API_MODULES = (
    "mate.sparse_mla_interface",
    "mate.msa_interface",
    "mate.mha_interface",
    "mate.gemm",
    "mate.api_logging",
    "flashinfer",
    *sorted(f"flashinfer.{p.stem}" for p in FLASHINFER_DIR.glob("*.py") if not p.name.startswith("_")),
)


def public_names(mod: ModuleType) -> list[str]:
    """``__all__`` when the module has one, else the public functions defined in it."""
    names = getattr(mod, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, o in vars(mod).items() if not n.startswith("_") and inspect.isfunction(o)
            and inspect.unwrap(o).__module__ == mod.__name__]


def public_functions(module_name: str) -> list[tuple[str, object]]:
    """``(name, unwrapped function)`` for each public function of the module, in order."""
    mod = importlib.import_module(module_name)
    out = []
    for name in public_names(mod):
        obj = getattr(mod, name)
        if inspect.isfunction(obj):
            out.append((name, inspect.unwrap(obj)))
    return out
