"""Compiles the Gluon groupwise FP8 GEMM for the H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_gemm_gluon.py [--out DIR]

For each configuration it prints registers, stack and local memory (spills), dynamic
shared memory, ptxas warnings (e.g. wgmma serialization) and counts of the SASS
instructions that matter (QGMMA tensor-core ops, UTMALDG TMA loads, barriers, wgmma
waits), read with the ``ptxas``/``cuobjdump`` shipped in Triton's wheel. Exits non-zero
when a configuration spills (except those of ``SPILL_OK``), exceeds the 227 KB of shared memory, lacks QGMMA, or ptxas
warns; K-interleaved configs (``KINT_CONFIGS``, every candidate of ``bench_gemm_smallm.py --kint`` and auto's
configs of ``tuning.GROUPWISE_GLUON`` with K-major scales, each also with M = 1) also when the launcher
rejects them or their shared memory exceeds the launcher's bound.
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
from mate.ops.gemm import groupwise_gluon_kint as gk
from mate.testing.sass import SMEM_LIMIT, compile_sm90, divisibility_attrs

PATTERN = re.compile(r"\b(QGMMA\.\S+|UTMALDG\S*|SYNCS\.\S+|BAR\.\S+|WARPGROUP\.\S+|STL\S*|LDL\S*|USETMAXREG\S*)")

# name: (LAYOUT, BLOCK_M, BLOCK_N, STAGES[, EPI_TMA, MN, KPS])
# MN: MN-major scales (stride_asm and stride_bsn 1, specialized at launch as in the small-M API calls)
# KPS: K blocks per ring stage (one ready wait and one empty arrival per stage)
CONFIGS = {
    "contig 128x192 st4 tma (grouped default)": (1, 128, 192, 4, True),
    "contig 128x192 st4": (1, 128, 192, 4),
    "contig 128x128 st5 tma": (1, 128, 128, 5, True),
    "contig 128x128 st5": (1, 128, 128, 5),
    "plain 128x128 st6": (0, 128, 128, 6),
    "plain 64x128 st6": (0, 64, 128, 6),
    # the small-M overrides of tuning.GROUPWISE_GLUON ((64 | 128, 7168, 2048)), both scale modes
    "plain 64x64 st13 MN (auto M 64, N 7168, K 2048)": (0, 64, 64, 13, False, True),
    "plain 64x64 st13 K": (0, 64, 64, 13, False, False),
    "plain 128x64 st8 MN (auto M 128, N 7168, K 2048)": (0, 128, 64, 8, False, True),
    "plain 128x64 st8 K": (0, 128, 64, 8, False, False),
    # other small-M candidates of benchmarks/bench_gemm_smallm.py
    "plain 64x32 st16 MN": (0, 64, 32, 16, False, True),
    "plain 64x128 st8 MN": (0, 64, 128, 8, False, True),
    "plain 128x16 st10 MN": (0, 128, 16, 10, False, True),
    "plain 128x32 st10 MN": (0, 128, 32, 10, False, True),
    "plain 128x128 st6 MN": (0, 128, 128, 6, False, True),
    "plain 128x192 st4 MN": (0, 128, 192, 4, False, True),
    # two K blocks per ring stage (half the barriers per K block)
    "plain 64x32 st8 kps2 MN": (0, 64, 32, 8, False, True, 2),
    "plain 64x32 st8 kps2 K": (0, 64, 32, 8, False, False, 2),
    "plain 64x64 st6 kps2 MN": (0, 64, 64, 6, False, True, 2),
    "plain 128x64 st4 kps2 MN": (0, 128, 64, 4, False, True, 2),
    "plain 128x32 st5 kps2 MN": (0, 128, 32, 5, False, True, 2),
    "plain 64x32 st4 kps4 MN": (0, 64, 32, 4, False, True, 4),
    "contig 128x192 st2 kps2 tma": (1, 128, 192, 2, True, False, 2),
    "contig 128x128 st2 kps2 tma": (1, 128, 128, 2, True, False, 2),
    # the MASKED layout as G * max_m rows (opt-in, benchmarks/probe_moe_gluon.py)
    "masked 128x192 st4 tma": (2, 128, 192, 4, True),
    "masked 128x128 st5 tma": (2, 128, 128, 5, True),
    "masked 64x128 st6": (2, 64, 128, 6),
}
# the K-interleaved kernel (groupwise_gluon_kint.py), MN-major scales, beside every candidate of
# benchmarks/bench_gemm_smallm.py --kint (compiled twice: as launched there, and with M = 1, which
# Triton specializes to a constexpr): name: (BLOCK_M, BLOCK_N, STAGES, KPS, SPLIT_K[, EAGER])
KINT_CONFIGS = {
    "kint 64x16 st16": (64, 16, 16, 1, 1),
    "kint 64x32 st16": (64, 32, 16, 1, 1),
    "kint 64x64 st6 kps2 s4": (64, 64, 6, 2, 4),
    "kint 64x128 st2 kps3 s2": (64, 128, 2, 3, 2),
    "kint 128x32 st4 kps2 s2": (128, 32, 4, 2, 2),
}
# spills accepted: 12 tile-level values (48 B) stored outside the K loop, reloaded once per
# tile; the K loop itself has none (the two K blocks of a stage, unrolled, hold more registers)
SPILL_OK = {"contig 128x192 st2 kps2 tma"}


def _desc_type(block_rows: int, cols: int = 128, dtype=gl.float8e4nv, name: str = "fp8e4nv") -> str:
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, cols], dtype)
    return f"tensordesc<{name}[{block_rows}, {cols}],{layout}>"


def compile_one(name, layout, bm, bn, stages, epi_tma=False, mn=False, kps=1, out_dir=None, keep=False,
                a_rows=None) -> bool:
    """``a_rows``: rows of A's TMA box (``groupwise_gluon.a_box_rows``; default BLOCK_M)."""
    wide = bn > 128
    bx = 128 if wide else bn
    b_type = _desc_type(bx)
    b2_type = _desc_type(bn - 128) if wide else b_type
    # without EPI_TMA the launcher passes a_desc as the (unused) output descriptors
    c_type = _desc_type(64, bx, gl.bfloat16, "bf16") if epi_tma else _desc_type(bm)
    c2_type = _desc_type(64, bn - 128, gl.bfloat16, "bf16") if epi_tma and wide else c_type
    sig = {"a_desc": _desc_type(a_rows or bm), "b_desc": b_type, "b2_desc": b2_type, "c_desc": c_type,
           "c2_desc": c2_type, "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "c_ptr": "*bf16", "idx_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "G": "i32",
           "stride_asm": "i32", "stride_ask": "i32", "stride_bsg": "i32", "stride_bsn": "i32", "stride_bsk": "i32",
           "stride_cm": "i32", "rows_per_group": "i32"}
    constexprs = {"LAYOUT": layout, "BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8, "STAGES": stages, "EPI_TMA": epi_tma,
                  "KPS": kps}
    # the launcher's pointers are 16-byte aligned; N, K and the strides of the benchmark shapes
    # are multiples of 16 (Triton specializes such integers at launch, and those equal to 1)
    if mn:
        constexprs.update(stride_asm=1, stride_bsn=1)
        aligned = ("as_ptr", "bs_ptr", "c_ptr", "idx_ptr", "N", "K", "stride_ask", "stride_cm")
    else:
        aligned = ("as_ptr", "bs_ptr", "c_ptr", "idx_ptr", "N", "K", "stride_asm", "stride_cm")
    sig.update({k: "constexpr" for k in constexprs})
    src = GluonASTSource(fn=gg.fp8_groupwise_gluon_kernel, signature=sig, constexprs=constexprs,
                         attrs=divisibility_attrs(sig, aligned))
    rep = compile_sm90(src, {"num_warps": 4, "maxnreg": gg.GLUON_MAX_REGS}, pattern=PATTERN, out_dir=out_dir,
                       tag=re.sub(r"\W+", "_", name), ptxas=True, keep_text=keep)
    print(f"{name}: {rep.registers} registers (launch), stack {rep.stack} B, local {rep.local} B, "
          f"{rep.spills} spill instructions, shared {rep.shared} B ({rep.shared / 1024:.0f} KB)")
    for w in rep.ptxas_warnings:
        print("    ptxas:", w)
    for k, n in sorted(rep.counts.items()):
        print(f"    {k}: {n}")
    has_mma = any(k.startswith("QGMMA") for k in rep.counts)
    return rep.shared <= SMEM_LIMIT and has_mma and (rep.spills == 0 or name in SPILL_OK) and not rep.ptxas_warnings


def _kint_candidates() -> dict:
    """The --kint candidates of bench_gemm_smallm.py as compile_kint arguments."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_gemm_smallm import KINT_CANDIDATES

    out = {}
    for cands in KINT_CANDIDATES.values():
        for name, c in cands.items():
            out[name] = (c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], c.get("KPS", 1), c.get("SPLIT_K", 1),
                         bool(c.get("EAGER", False)) and c.get("KPS", 1) > 1)
    return out


def _auto_kint() -> dict:
    """The distinct K-interleaved configs of tuning.GROUPWISE_GLUON (auto at K = 7168; several
    buckets share one) with K-major scales (with MN-major ones they are bench candidates)."""
    from mate.ops.gemm.tuning import GROUPWISE_GLUON

    out = {}
    for key, c in GROUPWISE_GLUON.items():
        if not c.get("KINT"):
            continue
        args = (c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], c["KPS"], c["SPLIT_K"],
                bool(c.get("EAGER")) and c["KPS"] > 1, False)
        if args not in out.values():
            out[f"kint auto {key} K-major"] = args
    return out


def compile_kint(name, bm, bn, stages, kps, split, eager=False, mn=True, out_dir=None, keep=False,
                 m1=False, a_rows=None) -> bool:
    """``mn``: MN-major scales (else K-major, K = 7168: 56 K blocks, a row stride Triton does
    not specialize); ``m1``: M = 1 (a constexpr at launch: every use of M must accept a Python int);
    ``a_rows``: rows of A's TMA box (default ``groupwise_gluon.a_box_rows`` of M: BLOCK_M, 8 at M = 1)."""
    gk.check_kint_config(bm, bn, stages, kps, split)  # what the launcher would reject
    if a_rows is None:  # what the launcher builds: at M = 1 an 8-row box
        a_rows = gk.a_box_rows(1, bm) if m1 else bm
    sig = {"a_desc": _desc_type(a_rows), "b_desc": _desc_type(bn), "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "c_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
           "stride_asm": "i32", "stride_ask": "i32", "stride_bsn": "i32", "stride_bsk": "i32", "stride_cm": "i32"}
    constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8, "STAGES": stages, "KPS": kps, "SPLIT_K": split,
                  "FUSED": split > 1, "EAGER": eager}
    constexprs.update({"stride_asm": 1, "stride_bsn": 1} if mn else {"stride_ask": 1, "stride_bsk": 1})
    if m1:
        constexprs["M"] = 1
    sig.update({k: "constexpr" for k in constexprs})
    aligned = ["as_ptr", "bs_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "N", "K", "stride_cm"] + (["stride_ask"] if mn else [])
    if not m1:
        aligned.append("M")  # the benchmark's M (64, 128)
    src = GluonASTSource(fn=gk.fp8_groupwise_kint_kernel, signature=sig, constexprs=constexprs,
                         attrs=divisibility_attrs(sig, aligned))
    rep = compile_sm90(src, {"num_warps": 4, "maxnreg": gg.GLUON_MAX_REGS}, pattern=PATTERN, out_dir=out_dir,
                       tag=re.sub(r"\W+", "_", name) + ("_m1" if m1 else ""), ptxas=True, keep_text=keep)
    est = gk.kint_shared_bytes(bm, bn, stages, kps, split)
    print(f"{name}{' (M 1)' if m1 else ''}: {rep.registers} registers (launch), stack {rep.stack} B, "
          f"local {rep.local} B, {rep.spills} spill instructions, shared {rep.shared} B "
          f"({rep.shared / 1024:.0f} KB, launcher's bound {est} B)")
    for w in rep.ptxas_warnings:
        print("    ptxas:", w)
    if not m1:
        for k, n in sorted(rep.counts.items()):
            print(f"    {k}: {n}")
    has_mma = any(k.startswith("QGMMA") for k in rep.counts)
    ok = rep.shared <= SMEM_LIMIT and rep.shared <= est and has_mma and rep.spills == 0 and not rep.ptxas_warnings
    if rep.shared > est:
        print(f"    FAIL: shared {rep.shared} B above the launcher's bound {est} B")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to keep the cubins and PTX (default: a temporary folder)")
    ap.add_argument("--only", default="", help="substring of the config names to compile")
    ap.add_argument("--keep", action="store_true", help="also keep the TTGIR, PTX and SASS text in --out")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="mate_gemm_gluon_")
    os.makedirs(out_dir, exist_ok=True)
    ok = True
    for name, cfg in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        try:
            ok &= compile_one(name, *cfg, out_dir=out_dir, keep=args.keep)
        except Exception as exc:  # report every config, then fail
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
            ok = False
    for name, cfg in {**KINT_CONFIGS, **_kint_candidates(), **_auto_kint()}.items():
        if args.only and args.only not in name:
            continue
        for m1 in (False, True):
            try:
                ok &= compile_kint(name, *cfg, out_dir=out_dir, keep=args.keep, m1=m1)
            except Exception as exc:
                print(f"{name}{' (M 1)' if m1 else ''}: FAILED {type(exc).__name__}: {str(exc)[-1500:]}")
                ok = False
    print("cubins in", out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
