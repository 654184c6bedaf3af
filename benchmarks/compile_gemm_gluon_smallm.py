"""Compiles the small-M Gluon groupwise FP8 GEMM (``groupwise_gluon_smallm.py``) for sm_90 without a GPU.

    python benchmarks/compile_gemm_gluon_smallm.py [--out DIR] [--only SUBSTRING]

Prints registers, spills, shared memory, ptxas warnings and the SASS instructions that matter
per configuration; exits non-zero when one spills, exceeds 227 KB of shared memory, lacks
QGMMA or ptxas warns.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from mate.ops.gemm import groupwise_gluon_smallm as gs
from mate.testing.sass import SMEM_LIMIT, compile_sm90, divisibility_attrs

PATTERN = re.compile(r"\b(QGMMA\.\S+|UTMALDG\S*|SYNCS\.\S+|BAR\.\S+|WARPGROUP\.\S+|STL\S*|LDL\S*|ATOMG\S*|RED\S*)")

# name: (BLOCK_W, BLOCK_M, STAGES, SPLIT_K, REDUCE, SLICE)
CONFIGS = {
    "w128 m64 st8 s4 last": (128, 64, 8, 4, 1, 32),
    "w128 m64 st8 s4 spread": (128, 64, 8, 4, 2, 32),
    "w64 m64 st12 s2 spread": (64, 64, 12, 2, 2, 32),
    "w64 m64 st12 s4 spread": (64, 64, 12, 4, 2, 16),
    "w128 m128 st6 s4 spread": (128, 128, 6, 4, 2, 32),
    "w64 m128 st6 s4 spread": (64, 128, 6, 4, 2, 16),
    "w128 m64 st4 s1": (128, 64, 4, 1, 0, 128),
    "w64 m64 st6 s1": (64, 64, 6, 1, 0, 64),
    "w128 m64 st8 s4 launch": (128, 64, 8, 4, 0, 32),
    "w128 m64 st8 s7 spread": (128, 64, 8, 7, 2, 32),
    "w64 m128 st8 s4 spread": (64, 128, 8, 4, 2, 16),
    "w128 m128 st3 s1": (128, 128, 3, 1, 0, 128),
    "w64 m128 st4 s1": (64, 128, 4, 1, 0, 64),
}


def _desc_type(block_rows: int) -> str:
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, 128], gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{block_rows}, 128],{layout}>"


def compile_one(name, bw, bm, stages, split, reduce, slice_rows, out_dir) -> bool:
    sig = {"w_desc": _desc_type(bw), "x_desc": _desc_type(bm), "xs_ptr": "*fp32", "ws_scale_ptr": "*fp32",
           "c_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
           "stride_xsm": "i32", "stride_xsk": "i32", "stride_wsn": "i32", "stride_wsk": "i32", "stride_cm": "i32"}
    constexprs = {"BLOCK_W": bw, "BLOCK_M": bm, "STAGES": stages, "SPLIT_K": split, "REDUCE": reduce,
                  "SLICE": slice_rows}
    sig.update({k: "constexpr" for k in constexprs})
    aligned = ("xs_ptr", "ws_scale_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "M", "N", "K", "stride_xsk", "stride_cm")
    src = GluonASTSource(fn=gs.fp8_groupwise_smallm_kernel, signature=sig, constexprs=constexprs,
                         attrs=divisibility_attrs(sig, aligned))
    rep = compile_sm90(src, {"num_warps": bw // 16}, pattern=PATTERN, out_dir=out_dir,
                       tag=re.sub(r"\W+", "_", name), ptxas=True, keep_text=True)
    print(f"{name}: {rep.registers} registers, stack {rep.stack} B, local {rep.local} B, "
          f"{rep.spills} spill instructions, shared {rep.shared} B ({rep.shared / 1024:.0f} KB)")
    for w in rep.ptxas_warnings:
        print("    ptxas:", w)
    for k, n in sorted(rep.counts.items()):
        print(f"    {k}: {n}")
    has_mma = any(k.startswith("QGMMA") for k in rep.counts)
    return rep.shared <= SMEM_LIMIT and has_mma and rep.spills == 0 and not rep.ptxas_warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to keep cubins, PTX, TTGIR and SASS")
    ap.add_argument("--only", default="", help="substring of the config names to compile")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="mate_gemm_smallm_")
    os.makedirs(out_dir, exist_ok=True)
    ok = True
    for name, cfg in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        try:
            ok &= compile_one(name, *cfg, out_dir)
        except Exception as exc:
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
            ok = False
    print("files in", out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
