"""Patched copies of kernel modules for probes: the library's kernels stay unchanged, a probe
edits a copy of their source (``apply_edits``) and imports it from a file (``import_source``;
the JIT reads a kernel's source from its file)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from types import ModuleType


def apply_edits(src: str, edits) -> str:
    """``src`` with each ``(old, new)`` of ``edits`` replaced in turn; each ``old`` must occur
    exactly once (a probe whose anchor moved fails instead of measuring the unpatched kernel)."""
    for old, new in edits:
        if src.count(old) != 1:
            raise RuntimeError(f"patch anchor found {src.count(old)} times, not once: {old[:70]!r}")
        src = src.replace(old, new)
    return src


def import_source(name: str, src: str) -> ModuleType:
    """Imports ``src`` as module ``name`` from a file in a fresh temporary folder."""
    path = os.path.join(tempfile.mkdtemp(prefix=f"mate_{name}_"), f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
