"""Compiles the Gluon groupwise FP8 GEMM for the H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_gemm_gluon.py [--out DIR]

For each configuration it prints registers, stack and local memory (spills), dynamic
shared memory, ptxas warnings (e.g. wgmma serialization) and counts of the SASS
instructions that matter (QGMMA tensor-core ops, UTMALDG TMA loads, barriers, wgmma
waits), read with the ``ptxas``/``cuobjdump`` shipped in Triton's wheel. Exits non-zero
when a configuration spills, exceeds the 227 KB of shared memory, lacks QGMMA, or ptxas
warns.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from mate.ops.gemm import groupwise_gluon as gg
from mate.testing.sass import SMEM_LIMIT, compile_sm90, divisibility_attrs

PATTERN = re.compile(r"\b(QGMMA\.\S+|UTMALDG\S*|SYNCS\.\S+|BAR\.\S+|WARPGROUP\.\S+|STL\S*|LDL\S*|USETMAXREG\S*)")

# name: (LAYOUT, BLOCK_M, BLOCK_N, STAGES, SPLIT_N)
CONFIGS = {
    "contig 128x128 st6": (1, 128, 128, 6, False),
    "contig 128x128 st5": (1, 128, 128, 5, False),
    "plain 128x128 st6": (0, 128, 128, 6, False),
    "plain 128x64 st8": (0, 128, 64, 8, False),
    "plain 64x256 splitN st4": (0, 64, 256, 4, True),
    "plain 64x128 splitN st6": (0, 64, 128, 6, True),
}


def _desc_type(block_rows: int) -> str:
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, 128], gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{block_rows}, 128],{layout}>"


def compile_one(name, layout, bm, bn, stages, split_n, out_dir) -> bool:
    sig = {"a_desc": _desc_type(bm), "b_desc": _desc_type(bn), "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "c_ptr": "*bf16", "idx_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "G": "i32",
           "stride_asm": "i32", "stride_ask": "i32", "stride_bsg": "i32", "stride_bsn": "i32", "stride_bsk": "i32",
           "stride_cm": "i32"}
    constexprs = {"LAYOUT": layout, "BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8, "STAGES": stages,
                  "SPLIT_N": split_n}
    sig.update({k: "constexpr" for k in constexprs})
    # the launcher's pointers are 16-byte aligned; N, K and the strides of the benchmark shapes
    # are multiples of 16 (Triton specializes such integers at launch)
    aligned = ("as_ptr", "bs_ptr", "c_ptr", "idx_ptr", "N", "K", "stride_asm", "stride_cm")
    src = GluonASTSource(fn=gg.fp8_groupwise_gluon_kernel, signature=sig, constexprs=constexprs,
                         attrs=divisibility_attrs(sig, aligned))
    rep = compile_sm90(src, {"num_warps": 4, "maxnreg": gg.GLUON_MAX_REGS}, pattern=PATTERN, out_dir=out_dir,
                       tag=re.sub(r"\W+", "_", name), ptxas=True)
    print(f"{name}: {rep.registers} registers (launch), stack {rep.stack} B, local {rep.local} B, "
          f"{rep.spills} spill instructions, shared {rep.shared} B ({rep.shared / 1024:.0f} KB)")
    for w in rep.ptxas_warnings:
        print("    ptxas:", w)
    for k, n in sorted(rep.counts.items()):
        print(f"    {k}: {n}")
    has_mma = any(k.startswith("QGMMA") for k in rep.counts)
    return rep.shared <= SMEM_LIMIT and has_mma and rep.spills == 0 and not rep.ptxas_warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to keep the cubins and PTX (default: a temporary folder)")
    ap.add_argument("--only", default="", help="substring of the config names to compile")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="mate_gemm_gluon_")
    os.makedirs(out_dir, exist_ok=True)
    ok = True
    for name, cfg in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        try:
            ok &= compile_one(name, *cfg, out_dir)
        except Exception as exc:  # report every config, then fail
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
            ok = False
    print("cubins in", out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
