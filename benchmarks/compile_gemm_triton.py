"""Compiles the TMA groupwise FP8 GEMM kernel's small-M candidates for sm_90 without a GPU.

    python benchmarks/compile_gemm_triton.py

For each distinct candidate of ``benchmarks/bench_gemm_smallm.py`` (bf16 output, plain
layout, fused split-K reduce) it prints registers, spill instructions, shared memory and
the QGMMA / TMA instructions, read with the tools shipped in Triton's wheel. Exits non-zero
when a config spills, exceeds 227 KB of shared memory or lacks QGMMA.
"""

from __future__ import annotations

import os
import re
import sys

import triton.language as tl
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gemm_smallm import CANDIDATES  # noqa: E402

from mate.ops.gemm import groupwise as gw  # noqa: E402
from mate.testing.sass import SMEM_LIMIT, compile_sm90, divisibility_attrs  # noqa: E402

PATTERN = re.compile(r"\b(QGMMA\.\S+|UTMALDG\S*|WARPGROUP\.DEPBAR\S*)")


def compile_one(cfg: dict):
    bm, bn, sk, st = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"], cfg["num_stages"]
    sig = {"a_desc": f"tensordesc<fp8e4nv[{bm}, 128]>", "b_desc": f"tensordesc<fp8e4nv[{bn}, 128]>",
           "as_ptr": "*fp32", "bs_ptr": "*fp32", "c_ptr": "*bf16", "cs_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32", "idx_ptr": "*bf16", "mm_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "G": "i32", "stride_asg": "i32", "stride_asm": "i32", "stride_ask": "i32", "stride_bsg": "i32",
           "stride_bsn": "i32", "stride_bsk": "i32", "stride_cg": "i32", "stride_cm": "i32", "stride_csm": "i32"}
    cx = dict(LAYOUT=gw.PLAIN, SPLIT_K=sk, FUSED_REDUCE=sk > 1, OUT_FP8=False, OUT_DTYPE=tl.bfloat16,
              BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=cfg.get("GROUP_M", 8), NUM_STAGES=st,
              MMA_LAG=cfg.get("MMA_LAG", False))
    sig.update({k: "constexpr" for k in cx})
    aligned = ("as_ptr", "bs_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "M", "N", "K", "stride_ask", "stride_cm")
    src = ASTSource(fn=gw.fp8_groupwise_tma_kernel, signature=sig, constexprs=cx,
                    attrs=divisibility_attrs(sig, aligned))
    return compile_sm90(src, {"num_warps": cfg["num_warps"], "num_stages": st}, pattern=PATTERN)


def main() -> int:
    ok = True
    seen = set()
    for cands in CANDIDATES.values():
        for name, cfg in cands.items():
            if name in seen or cfg.get("GLUON"):  # Gluon candidates: benchmarks/compile_gemm_gluon.py
                continue
            seen.add(name)
            try:
                rep = compile_one(cfg)
            except Exception as exc:
                print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:500]}")
                ok = False
                continue
            good = rep.spills == 0 and rep.shared <= SMEM_LIMIT and any(k.startswith("QGMMA") for k in rep.counts)
            ok &= good
            print(f"{name:>22}: {rep.registers} regs, {rep.spills} spills, {rep.shared / 1024:.0f} KB shared, "
                  f"{', '.join(f'{k} x{v}' for k, v in sorted(rep.counts.items()))}{'' if good else '  <-- BAD'}",
                  flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
