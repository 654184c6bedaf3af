"""Compiles the Gluon sparse MLA decode kernel for the H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_sparse_mla_gluon.py [--out DIR]

For each specialization (split or not, 2 or 3 stages) it prints the registers, stack and
local memory (spills), the dynamic shared memory, and counts of the SASS instructions that
matter (QGMMA / HGMMA tensor-core ops, cp.async LDGSTS, barriers, wgmma waits), read with
the ``cuobjdump`` shipped in Triton's wheel. Exits non-zero when a specialization spills in
its main loop, needs more than the 227 KB of shared memory an SM offers, or lacks the
wgmma instructions.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

from triton.experimental.gluon._runtime import GluonASTSource

from mate.ops.sparse_mla import decode_gluon as dg
from mate.ops.sparse_mla.metadata import HEAD_DIM_ROPE, HEAD_DIM_V
from mate.testing.sass import SMEM_LIMIT, compile_sm90, divisibility_attrs

POINTERS = ("q_ptr", "kv_ptr", "idx_ptr", "seq_lens_ptr", "out_ptr", "lse_ptr", "po_ptr", "plse_ptr")
PATTERN = re.compile(r"\b(QGMMA\.\S+|HGMMA\.\S+|LDGSTS\S*|BAR\.SYNC\S*|WARPGROUP\.DEPBAR\S*|STL\S*|LDL\S*)")


def compile_decode(fn, split: bool, constexprs: dict, num_warps: int, out_dir: str | None, tag: str,
                   pattern: re.Pattern | None, keep_text: bool = False, after: dict | None = None,
                   ptxas: bool = False):
    """Compiles a Gluon decode kernel (the argument list the 64-head and small-H kernels share;
    ``constexprs`` before D_V / D_R, in the kernel's order; ``after``: constexprs after them) for
    sm_90. The pointers are 16-byte aligned, as the launcher guarantees (it falls back to the
    plain kernel otherwise). ``ptxas``: also collect ptxas's warnings (``compile_sm90``)."""
    sig = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "idx_ptr": "*i32", "seq_lens_ptr": "*i32",
           "out_ptr": "*bf16", "lse_ptr": "*fp32", "po_ptr": "*fp16" if split else "*bf16", "plse_ptr": "*fp32",
           "num_tokens": "i32", "qk_scale_log2": "fp32", "out_scale": "fp32", "H": "i32", "q_len": "i32",
           "top_k": "i32", "split_blocks": "i32", "num_splits": "i32"}
    constexprs = {**constexprs, "D_V": HEAD_DIM_V, "D_R": HEAD_DIM_ROPE, **(after or {})}
    sig.update({k: "constexpr" for k in constexprs})
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=divisibility_attrs(sig, POINTERS))
    return compile_sm90(src, {"num_warps": num_warps}, pattern=pattern, out_dir=out_dir, tag=tag, keep_text=keep_text,
                        ptxas=ptxas)


def compile_one(split: bool, stages: int, out_dir: str) -> bool:
    constexprs = {"SPLIT": split, "HAS_SEQ_LENS": True, "STAGES": stages, "BLOCK_H": dg.GLUON_BLOCK_H,
                  "BLOCK_N": dg.GLUON_BLOCK_N}
    rep = compile_decode(dg.sparse_mla_decode_gluon_kernel, split, constexprs, dg.GLUON_NUM_WARPS, out_dir,
                         f"gluon_split{int(split)}_stages{stages}", PATTERN)
    counts, shared = rep.counts, rep.shared
    # Spill traffic inside the main loop: between the cp.async wait and the loop's back branch.
    lines = rep.sass.splitlines()
    start = next((i for i, ln in enumerate(lines) if "DEPBAR.LE SB0" in ln), 0)
    end = next((i for i in range(len(lines) - 1, start, -1) if re.search(r"BRA 0x[0-9a-f]+", lines[i])
                and "@" in lines[i]), len(lines))
    loop_spills = sum(1 for ln in lines[start:end] if re.search(r"\b(STL|LDL)", ln))
    print(f"split={split} stages={stages}: {rep.registers} registers, "
          f"stack {rep.stack} B, "
          f"local {rep.local} B, {loop_spills} spill instructions in the loop, "
          f"shared {shared} B ({shared / 1024:.0f} KB)")
    for name, n in sorted(counts.items()):
        print(f"    {name}: {n}")
    has_mma = any(k.startswith("QGMMA") for k in counts) and any(k.startswith("HGMMA") for k in counts)
    return shared <= SMEM_LIMIT and has_mma and loop_spills == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to keep the cubins (default: a temporary folder)")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="mate_gluon_")
    os.makedirs(out_dir, exist_ok=True)
    ok = True
    for split in (False, True):
        for stages in (2, 3):
            ok &= compile_one(split, stages, out_dir)
    print("cubins in", out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
