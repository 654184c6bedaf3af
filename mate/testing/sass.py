"""Compiles a Triton or Gluon kernel for the H200 (sm_90) without a GPU and reads its cubin.

Registers, stack and local memory come from ``cuobjdump --dump-resource-usage``, the SASS
from ``cuobjdump --dump-sass`` and the optional ptxas warnings from ``ptxas -v`` on the PTX,
all shipped in Triton's wheel (``triton/backends/nvidia/bin``).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from mate._core.hopper import SMEM_PER_PROGRAM

__all__ = ["SMEM_LIMIT", "SassReport", "compile_sm90", "divisibility_attrs", "opcode_counts"]

SMEM_LIMIT = SMEM_PER_PROGRAM
"""Dynamic shared memory one program may use on an H100/H200 SM (``mate._core.hopper``)."""

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_SPILL = re.compile(r"\b(STL|LDL)")
_OPCODE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")


@dataclasses.dataclass
class SassReport:
    kernel: object
    """The compiled kernel (``asm`` holds ``ttgir``, ``ptx`` and ``cubin``)."""
    registers: int | None
    stack: int | None
    local: int | None
    shared: int
    spills: int
    """STL/LDL instructions in the whole SASS."""
    counts: collections.Counter
    """Matches of the caller's pattern in the SASS (trailing ``;`` dropped)."""
    sass: str
    ptxas_warnings: list[str]
    cubin_path: str | None


def divisibility_attrs(signature: dict, aligned) -> dict:
    """``attrs`` of an ``ASTSource`` marking the named arguments as multiples of 16 (what
    Triton specializes at launch for 16-byte aligned pointers and such integers)."""
    names = list(signature)
    return {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}


def opcode_counts(sass: str) -> collections.Counter:
    """Instructions of a SASS dump by opcode (with modifiers, predicates dropped)."""
    ops = collections.Counter()
    for ln in sass.splitlines():
        m = _OPCODE.match(ln)
        if m:
            ops[m.group(2)] += 1
    return ops


def _tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(TOOLS, name), *args], capture_output=True, text=True)


def compile_sm90(src, options: dict, *, pattern: re.Pattern | None = None, out_dir: str | None = None,
                 tag: str = "kernel", ptxas: bool = False, keep_text: bool = False) -> SassReport:
    """Compiles ``src`` (an ``ASTSource`` or ``GluonASTSource``) for sm_90 with ``options``.

    ``out_dir``: where ``<tag>.cubin`` (and with ``keep_text`` the ``.ptx``, ``.ttgir`` and
    ``.sass``) are kept; without it they go to a temporary folder that is removed.
    ``ptxas``: also assemble the PTX with ``ptxas -v`` and collect its warnings (e.g. wgmma
    serialization)."""
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory(prefix="mate_sass_") as tmp:
        folder = out_dir or tmp
        os.makedirs(folder, exist_ok=True)
        base = os.path.join(folder, tag)
        with open(base + ".cubin", "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = _tool("cuobjdump", "--dump-resource-usage", base + ".cubin")
        dump = _tool("cuobjdump", "--dump-sass", base + ".cubin")
        usage.check_returncode()
        dump.check_returncode()
        sass = dump.stdout
        warnings = []
        if ptxas or (out_dir and keep_text):
            with open(base + ".ptx", "w") as f:
                f.write(kernel.asm["ptx"])
        if ptxas:
            px = _tool("ptxas", "-v", "-arch=sm_90a", base + ".ptx", "-o", os.devnull)
            warnings = [ln for ln in (px.stdout + px.stderr).splitlines()
                        if "warning" in ln.lower() or "performance loss" in ln.lower()]
        if out_dir and keep_text:
            with open(base + ".ttgir", "w") as f:
                f.write(kernel.asm["ttgir"])
            with open(base + ".sass", "w") as f:
                f.write(sass)
    res = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage.stdout)}
    counts = collections.Counter(m.group(1).rstrip(";") for m in pattern.finditer(sass)) if pattern else \
        collections.Counter()
    spills = sum(1 for ln in sass.splitlines() if _SPILL.search(ln))
    return SassReport(kernel=kernel, registers=res.get("REG"), stack=res.get("STACK"), local=res.get("LOCAL"),
                      shared=kernel.metadata.shared, spills=spills, counts=counts, sass=sass,
                      ptxas_warnings=warnings, cubin_path=base + ".cubin" if out_dir else None)
