"""Compiles the small-H Gluon sparse MLA decode kernels for the H200 (sm_90) without a GPU.

    python benchmarks/compile_sparse_mla_gluon_small_h.py [--out DIR] [--quick] [--wg-only]

For each specialization (8-warp kernel: 16 / 32 heads, split or not, Vᵀ loaded early or not;
one-warpgroup kernel of decode_gluon_small_h2.py and its dual form: 16 heads, split or not, FP8 P·V
unless --pv-fp16) it prints
registers, stack, local memory, dynamic shared memory and counts of the SASS instructions that
matter (QGMMA / HGMMA, cp.async LDGSTS, barriers, shuffles, shared loads and stores). Exits
non-zero when a specialization spills, needs more than the 227 KB of shared memory an SM
offers (the one-warpgroup kernel: more than the 113 KB that lets 2 programs share an SM, or
spills inside its main loop), or lacks the wgmma instructions.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

from mate.ops.sparse_mla import decode_gluon_small_h as dg
from mate.ops.sparse_mla import decode_gluon_small_h2 as dw
from mate.ops.sparse_mla.metadata import GLUON_SMALL_H_STAGES, GLUON_WG_STAGES
from mate.testing.sass import SMEM_LIMIT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_sparse_mla_gluon import compile_decode  # noqa: E402

PATTERN = re.compile(r"\b(QGMMA\.\S+|HGMMA\.\S+|LDGSTS\S*|BAR\.SYNC\S*|WARPGROUP\.DEPBAR\S*|STL\S*|LDL\S*|"
                     r"SHFL\S*|LDS\S*|STS\S*|F2FP\S*|PRMT|LDSM\S*)")


def loop_body(sass: str) -> list[str] | None:
    """Instructions of the longest loop (the main loop: from the target of its predicated
    backward branch to the branch); None without a loop. Unconditional backward branches are
    not loops of the kernel's code: a ``gl.warp_specialize`` kernel's workers wait in one that
    spans the default partition's code."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    best = None
    for i, (addr, text) in enumerate(ins):
        m = re.search(r"@!?U?P\d\s+BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = next(j for j, (a, _) in enumerate(ins) if a == int(m.group(1), 16))
            if best is None or i - start > best[1] - best[0]:
                best = (start, i)
    return None if best is None else [t for _, t in ins[best[0]:best[1] + 1]]


def loop_summary(sass: str) -> str:
    """Instructions, CTA barriers, memory fences, wgmma waits, shared-memory accesses and spill
    instructions of the main loop."""
    body = loop_body(sass)
    if body is None:
        return "no loop"
    n = lambda pat: sum(1 for t in body if re.search(pat, t))
    spills = n(r"\b(STL|LDL)")
    lds, sts = n(r"\bLD(S|SM)\b|\bLDS\.|\bLDSM\."), n(r"\bST(S|SM)\b|\bSTS\.|\bSTSM\.")
    return (f"{len(body)} instructions, {n(r'BAR.SYNC')} BAR.SYNC, {n(r'MEMBAR')} MEMBAR, "
            f"{n(r'WARPGROUP.DEPBAR')} wgmma waits, {n(r'LDGSTS')} LDGSTS, {lds} shared loads, "
            f"{sts} shared stores, {spills} spill instructions")


def report(tag: str, rep, pv_hgmma: bool = True) -> bool:
    """Prints a specialization's resources, main loop and instruction counts; returns whether
    it has its wgmma kinds (QGMMA for Sᵀ; HGMMA for P·V unless ``pv_hgmma`` is False, where
    P·V runs on QGMMA too)."""
    print(f"{tag}: {rep.registers} registers, stack {rep.stack} B, local {rep.local} B, {rep.spills} spill "
          f"instructions, shared {rep.shared} B ({rep.shared / 1024:.1f} KB); main loop: {loop_summary(rep.sass)}")
    for name, n in sorted(rep.counts.items()):
        print(f"    {name}: {n}")
    return any(k.startswith("QGMMA") for k in rep.counts) and (
        not pv_hgmma or any(k.startswith("HGMMA") for k in rep.counts))


def compile_one(block_h: int, split: bool, stages: int, out_dir: str, v_early: bool = False) -> bool:
    constexprs = {"SPLIT": split, "HAS_SEQ_LENS": True, "STAGES": stages, "V_EARLY": v_early, "BLOCK_H": block_h,
                  "BLOCK_N": dg.SMALL_H_BLOCK_N}
    tag = f"small_h{block_h}_split{int(split)}{'_early' if v_early else ''}_stages{stages}"
    rep = compile_decode(dg.sparse_mla_decode_small_h_kernel, split, constexprs, dg.SMALL_H_NUM_WARPS, out_dir, tag,
                         PATTERN, keep_text=True)
    has_mma = report(tag, rep)
    return rep.shared <= SMEM_LIMIT and has_mma and rep.spills == 0


def compile_wg(block_h: int, split: bool, out_dir: str, dual: bool = False, pv_fp8: bool = dw.WG_PV_FP8) -> bool:
    """The one-warpgroup kernel, or (``dual``) its two-chain form; fails above
    ``dw.WG_SMEM_LIMIT`` (2 programs per SM; the dual kernel: the SM's 227 KB) or with spills
    in a main loop."""
    constexprs = {"SPLIT": split, "HAS_SEQ_LENS": True, "STAGES": GLUON_WG_STAGES, "BLOCK_H": block_h,
                  "BLOCK_N": dw.WG_BLOCK_N}
    tag = f"{'dual' if dual else 'wg'}{block_h}_split{int(split)}_stages{GLUON_WG_STAGES}{'_pvfp8' if pv_fp8 else ''}"
    rep = compile_decode(dw.sparse_mla_decode_small_h_wg_kernel, split, constexprs, dw.WG_NUM_WARPS, out_dir, tag,
                         PATTERN, keep_text=True,
                         after={"CHAINS": 2 if dual else 1, "PV_FP8": pv_fp8})
    has_mma = report(tag, rep, pv_hgmma=not pv_fp8)
    loop_spills = sum(1 for t in loop_body(rep.sass) or () if re.search(r"\b(STL|LDL)", t))
    limit = SMEM_LIMIT if dual else dw.WG_SMEM_LIMIT
    return rep.shared <= limit and has_mma and loop_spills == 0  # spills outside the loop: prologue


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to keep the cubins (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="only the default specializations")
    ap.add_argument("--wg-only", action="store_true", help="only the one-warpgroup kernel")
    ap.add_argument("--pv-fp16", action="store_true", help="the one-warpgroup kernel with fp16 P·V (Vᵀ widened)")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="mate_gluon_small_h_")
    os.makedirs(out_dir, exist_ok=True)
    ok = True
    for split in (True,) if args.quick else (True, False):
        ok &= compile_wg(16, split, out_dir, pv_fp8=not args.pv_fp16)
        ok &= compile_wg(16, split, out_dir, dual=True, pv_fp8=not args.pv_fp16)
    for v_early in () if args.wg_only else (True, False):
        for block_h in (16, 32):
            for split in (False, True):
                if args.quick and (split or not v_early):
                    continue
                ok &= compile_one(block_h, split, GLUON_SMALL_H_STAGES, out_dir, v_early=v_early)
    print("cubins in", out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
