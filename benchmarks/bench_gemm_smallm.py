"""Small-M groupwise FP8 GEMM: ``auto`` against Gluon kernel candidates and DeepGEMM.

    python benchmarks/bench_gemm_smallm.py [--budget SECONDS] [--only M,N,K] [--kps | --kint | --m1 | --flat]
        [--warm-only | --no-warm --skip JSON]

For each (M, N, K) it times, interleaved (``time_interleaved``, CUDA-graph replays over
rotated inputs), ``gemm_fp8_nt_groupwise(backend="auto")``, each candidate config of the
Gluon kernel (``groupwise_gluon.py``, launched through ``groupwise_gemm_triton`` with
``GLUON``, bypassing the table) and DeepGEMM ``fp8_gemm_nt``, all with MN-major scales, and
prints us, TFLOP/s, GB/s (operand bytes once), the ratio DeepGEMM time / time (bar: >= 0.95),
the max relative error against the fp32 reference (max |out - ref| / max |ref|, NaN-poisoned
output) and whether two runs are bitwise equal; the note of each shape's first candidate
holds its error with K-major scales. Compiles (candidates, DeepGEMM JIT) are warmed up in parallel worker processes
first, which fill the on-disk caches; a kint candidate also runs 200 times back to back there
and is left out of the timing if that faults or is not bitwise repeatable (``--warm-only``
prints those pairs for ``--skip``, so one process can warm up and others time one shape each).
Candidate names: ``BMxBN stSTAGES[ kpsKPS]`` (KPS: K blocks per ring stage; ``--kps`` times
``KPS_CANDIDATES`` instead of ``CANDIDATES``; BLOCK_M 64: the two math warpgroups split the
columns; 128: the rows; the producer copies the scales into the ring for BLOCK_N <= 128).
``kint BMxBN stSTAGES[ kpsKPS][ sSPLIT]``: the K-interleaved kernel (``groupwise_gluon_kint.py``:
both math warpgroups own the whole tile and take alternate ring stages; SPLIT K splits over
programs, reduced in split order by the tile's last unit); ``--kint`` times ``KINT_CANDIDATES``.
``flat 64xBN stSTAGES[ kpsKPS]``: the single-partition kernel (``groupwise_gluon_flat.py``: one warpgroup,
no warp-specialize region); ``--flat`` times ``FLAT_CANDIDATES`` on ``FLAT_SHAPES``.
``--m1`` times ``M1_CANDIDATES`` (plain-Triton configs at M = 1 with an M = 64 control; GB/s
there counts the weight bytes only): ``tma`` (A and B by TMA), ``aptr`` (A by masked pointer
loads, B by TMA: the kernel's A_PTR), ``ptr`` (the pointer-load kernel), and two diagnostics
that are not legal launches: ``pad`` (A's TMA descriptor over a zero-padded copy with
BLOCK_M rows, M unchanged) and ``nospec`` (the TMA kernel compiled without Triton's M == 1
specialization); ``sSPLIT`` where SPLIT_K > 1.
DeepGEMM's picks (DG_PRINT_CONFIGS, H200): (64, 2112, 7168) 64x16 16 stages,
(64, 4096, 7168) 64x32 16, (128, 2112, 7168) 64x32 16, (128, 4096, 7168) 64x64 13,
(64, 7168, 2048) 64x64 13, (128, 7168, 2048) 64x112 9, (64, 24576, 1536) 64x96 2-CTA
cluster 10, (128, 24576, 1536) 128x192 4; one TMA and one math warpgroup, no split-K.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # spawned warm-up workers import mate too
    sys.path.insert(0, ROOT)

DEVICE = "cuda"
SHAPES = ((64, 2112, 7168), (64, 4096, 7168), (128, 2112, 7168), (128, 4096, 7168),
          (64, 7168, 2048), (128, 7168, 2048), (64, 24576, 1536), (128, 24576, 1536),
          (64, 7168, 16384), (128, 7168, 16384), (32, 7168, 16384), (16, 7168, 16384))


def _g(bm, bn, stages, kps=1):
    cfg = {"GLUON": True, "BLOCK_M": bm, "BLOCK_N": bn, "num_stages": stages, "GROUP_M": 8, "num_warps": 4}
    if kps > 1:
        cfg["KPS"] = kps
    return f"{bm}x{bn} st{stages}" + (f" kps{kps}" if kps > 1 else ""), cfg


def _k(bm, bn, stages, kps=1, split=1, eager=False, reduce="wait"):
    """A config of the K-interleaved kernel (groupwise_gluon_kint.py), split-K over programs;
    ``eager``: a stage's next K block's wgmma issued before the previous one is scaled;
    ``reduce``: the split-K reduce (``wait``: the last split waits for the others' partials)."""
    name, cfg = _g(bm, bn, stages, kps)
    name = "kint " + name + (f" s{split}" if split > 1 else "") + (" e" if eager else "")
    name += f" {reduce}" if split > 1 and reduce != "wait" else ""
    return name, {**cfg, "KINT": True, "SPLIT_K": split, "EAGER": eager, "REDUCE": reduce}


# tiles in the comments (132 SMs: one wave up to 132)
CANDIDATES = {
    (64, 2112, 7168): dict([
        _g(64, 32, 16),  # 66
        _g(128, 16, 10),  # 132
    ]),
    (64, 4096, 7168): dict([
        _g(64, 32, 16),  # 128
        _g(64, 64, 13),  # 64
    ]),
    (128, 2112, 7168): dict([
        _g(64, 32, 16),  # 132
        _g(128, 16, 10),  # 132, weights read once
    ]),
    (128, 4096, 7168): dict([
        _g(64, 64, 13),  # 128
        _g(128, 32, 10),  # 128, weights read once
    ]),
    (64, 7168, 2048): dict([
        _g(64, 64, 13),  # 112 (auto)
        _g(64, 32, 16),  # 224
    ]),
    (128, 7168, 2048): dict([
        _g(128, 64, 8),  # 112, weights read once (auto)
        _g(64, 128, 8),  # 112
    ]),
    (64, 24576, 1536): dict([
        _g(64, 128, 8),  # 192
    ]),
    (128, 24576, 1536): dict([
        _g(128, 128, 6),  # 192
        _g(128, 192, 4),  # 128, DeepGEMM's tile (scales one K block ahead)
    ]),
}


# --kps: K blocks per ring stage (KPS 2/4: half/a quarter of the barriers per K block) beside
# the KPS 1 Gluon config they derive from (where auto is not already that config)
KPS_CANDIDATES = {
    (64, 2112, 7168): dict([_g(64, 32, 16), _g(64, 32, 8, 2), _g(64, 32, 4, 4)]),
    (64, 4096, 7168): dict([_g(64, 32, 16), _g(64, 32, 8, 2), _g(64, 32, 4, 4)]),
    (128, 2112, 7168): dict([_g(64, 32, 16), _g(64, 32, 8, 2), _g(64, 32, 4, 4)]),
    (128, 4096, 7168): dict([_g(64, 64, 13), _g(64, 64, 6, 2), _g(128, 32, 5, 2)]),
    (64, 7168, 2048): dict([_g(64, 64, 6, 2), _g(64, 32, 8, 2)]),  # auto: Gluon 64x64 st13
    (128, 7168, 2048): dict([_g(128, 64, 4, 2), _g(64, 64, 6, 2)]),  # auto: Gluon 128x64 st8
}


# --kint: the K-interleaved kernel (both math warpgroups own the tile, K stages alternate between
# them, STAGES even; split-K over programs with the fused deterministic reduce); (tiles x splits)
# units and the bytes one unit reads (A + B slices) in the comments. The first of each shape is
# auto's config (tuning.GROUPWISE_GLUON); the others came next on the H200 (the losers of that run,
# 64x16, 128x32, 128x64 and 64x128 tiles, are in tuning.py's docstring)
KINT_CANDIDATES = {
    (64, 2112, 7168): dict([
        _k(64, 32, 4, 4, 2, True),  # 132, 344 KB (auto: 9.4 us, 1.05x DeepGEMM; 9.9 with the fused reduce)
        _k(64, 32, 4, 4, 2, True, "fused"),  # 9.9
        _k(64, 32, 8, 2, 2, True),
    ]),
    # three math warpgroups and a ring prologue before the warp-specialized region: measured
    # in session 16 and removed (groupwise_gluon_kint.py's docstring)
    (64, 4096, 7168): dict([
        _k(64, 32, 4, 4, 1, True),  # 128, 688 KB (auto: 12.5 us, 0.93-0.94x)
        _k(64, 32, 8, 2, 1, True),  # 12.5
    ]),
    (128, 2112, 7168): dict([
        _k(64, 64, 6, 2, 2, True),  # 132, 458 KB (auto: 10.9-11.0 us, 0.98x; 11.4-11.5 with the fused reduce)
        _k(64, 64, 6, 2, 2, True, "fused"),  # 11.5
        _k(64, 32, 4, 4, 1, True),  # 132, 688 KB: 11.7-11.8
    ]),
    (128, 4096, 7168): dict([
        _k(64, 64, 6, 2, 1, True),  # 128, 918 KB, DeepGEMM's tile (auto: 13.7 us, 0.94x)
        _k(64, 64, 6, 2),  # 13.8
        _k(64, 64, 4, 3, 1, True),  # 14.5 (session 15)
    ]),
    # K = 16384 (128 K blocks; H200 2026-11-30, after the GPU tests: Triton 64x128 ran 37.5 us at
    # M = 64 against DeepGEMM's 36.4, 48.3 against 45.8 at M = 128)
    (64, 7168, 16384): dict([
        _k(64, 64, 6, 2, 1, True),  # 112, 2 MB (auto: 35.7 us, 1.02x)
        _k(64, 128, 2, 3, 2),  # 56 x 2 splits, 3 MB: 41.8
        _k(64, 32, 4, 4, 1, True),  # 224 (two waves): 44.1
    ]),
    # M 17-32 and 1-16 share M = 64's 112 tiles (H200 session 15, us: Triton 64x128 s2 36.7 / 35.7 at
    # M = 32 / 16, this 33.8 / 33.0, DeepGEMM 37.1 / 36.3; auto's config since)
    (32, 7168, 16384): dict([_k(64, 64, 6, 2, 1, True)]),
    (16, 7168, 16384): dict([_k(64, 64, 6, 2, 1, True)]),
    (128, 7168, 16384): dict([
        _k(128, 64, 6, 1, 1),  # 112, 3 MB, B read once (auto: 46.6 us, 0.98x)
        _k(64, 64, 6, 2, 1, True),  # 224 (two waves): 51.7
        _k(64, 128, 2, 3, 1),  # 112, 3 MB: 55.9
    ]),
}


def _f(bn, stages, kps=1, eager=False):
    """A config of the single-partition kernel (groupwise_gluon_flat.py: one warpgroup, 64-row
    tiles; ``eager``: a stage's next K block's wgmma issued before the previous one is scaled)."""
    cfg = {"GLUON": True, "FLAT": True, "BLOCK_M": 64, "BLOCK_N": bn, "num_stages": stages, "GROUP_M": 8,
           "num_warps": 4}
    if kps > 1:
        cfg["KPS"] = kps
    if eager:
        cfg["EAGER"] = True
    return f"flat 64x{bn} st{stages}" + (f" kps{kps}" if kps > 1 else "") + (" e" if eager else ""), cfg


# --flat: the single-partition kernel (no warp-specialize region, whose fixed ~0.4 us was the
# gap to DeepGEMM at small M and short K); the first of each shape is what auto took from it
FLAT_SHAPES = ((1, 7168, 2048), (16, 7168, 2048), (32, 7168, 2048), (64, 7168, 2048), (128, 7168, 2048),
               (16, 24576, 1536), (64, 24576, 1536), (16, 32768, 512), (128, 32768, 512),
               (128, 2112, 7168), (128, 4096, 7168), (64, 4096, 7168))
# "e" (EAGER): two wgmmas of a stage in flight. The H200 run of 2026-11-30 (session 12) took the
# eager configs first below into auto (the others were auto's before, or came next); at K = 7168
# the eager kernel lost to the K-interleaved one ((64, 4096, 7168) 13.4 against 12.8 us, (128,
# 2112, 7168) 12.6 against 11.8), so those shapes left this list
FLAT_CANDIDATES = {
    **{(m, 7168, 2048): dict([_f(64, 4, 2, True), _f(64, 4, 2), _f(64, 3, 4, True)]) for m in (1, 16)},
    (32, 7168, 2048): dict([_f(64, 3, 4, True), _f(64, 4, 2), _f(64, 4, 2, True)]),
    # 64x32: 224 tiles, two programs (two chains) per SM within 113 KB (session 14 candidates)
    (64, 7168, 2048): dict([_f(64, 3, 4, True), _f(32, 4, 2, True), _f(32, 2, 4, True), _f(32, 3, 2, True)]),
    (128, 7168, 2048): dict([_f(64, 3, 2, True), _f(64, 3, 2)]),  # 224 tiles, two programs per SM
    (16, 24576, 1536): dict([_f(64, 2, 2, True), _f(64, 2, 2)]),
    (64, 24576, 1536): dict([_f(64, 2, 2), _f(64, 2, 2, True)]),
    (16, 32768, 512): dict([_f(128, 2, 2), _f(128, 2, 2, True)]),
    (128, 32768, 512): dict([_f(128, 2, 2, True), _f(128, 2, 2)]),  # auto ran cuBLAS here before
    # not measured yet (session 14, after the 64x32 result at (64, 7168, 2048)): narrow tiles so that
    # two programs (two chains) share each SM at K = 7168, where auto runs the K-interleaved kernel;
    # with all 56 K blocks' scales in shared memory (32 KB) these fit 2 per SM at <= 113 KB
    (128, 2112, 7168): dict([_f(16, 4, 2, True), _f(16, 3, 2, True)]),  # 264 tiles
    (128, 4096, 7168): dict([_f(32, 3, 2, True), _f(16, 4, 2, True)]),  # 256 / 512 tiles
    (64, 4096, 7168): dict([_f(16, 4, 2, True), _f(16, 3, 2, True)]),  # 256 tiles
}


def _t(bm, bn, stages, kind="tma", split=1):
    """A config of the plain-Triton kernels (see ``--m1`` in the module docstring)."""
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_stages": stages, "num_warps": 4, "GROUP_M": 8, "SPLIT_K": split,
           "TMA": kind != "ptr"}
    if kind == "aptr":
        cfg["A_PTR"] = True
    if kind in ("pad", "nospec"):
        cfg["DIAG"] = kind
    return f"{kind} {bm}x{bn} st{stages}" + (f" s{split}" if split > 1 else ""), cfg


# --m1: why M = 1 runs ~2 us slower than M = 64 at (24576, 1536) with the same tiles and bytes
# (H200: auto 15.6 us, DeepGEMM 14.6; M = 64: Triton 64x64 13.6, DeepGEMM 14.3). At M = 1 the A
# box of a TMA load (BLOCK_M x 128) is all out of bounds but one row; DeepGEMM adds BLOCK_M 16
# and 32 for M <= 16 / 32 ("smaller block M can avoid TMA L2 OOB bound", sm90 heuristics).
# BLOCK_M 16 here compiles to mma.sync (HMMA.16816 on fp8 converted to fp16), not wgmma.
M1_SHAPES = ((1, 24576, 1536), (64, 24576, 1536), (1, 4096, 7168), (1, 2112, 7168),
             (16, 24576, 1536), (32, 24576, 1536), (16, 4096, 7168), (32, 4096, 7168), (32, 2112, 7168),
             (16, 7168, 2048), (32, 7168, 2048), (1, 7168, 2048), (16, 2112, 7168))
M1_CANDIDATES = {
    (1, 24576, 1536): dict([  # auto: tma 64x128 st4 (192 tiles)
        _t(64, 128, 4), _t(64, 64, 4),
        _t(64, 128, 4, "aptr"), _t(64, 64, 4, "aptr"), _t(64, 64, 6, "aptr"),
        _t(64, 128, 3, "ptr"), _t(64, 128, 4, "ptr"), _t(64, 64, 4, "ptr"), _t(64, 64, 6, "ptr"),
        _t(16, 128, 4), _t(16, 64, 4),
        _t(64, 128, 4, "pad"), _t(64, 128, 4, "nospec"),
    ]),
    (64, 24576, 1536): dict([  # the control (auto: tma 64x64 st4, 384 tiles)
        _t(64, 128, 4), _t(64, 128, 4, "aptr"), _t(64, 64, 4, "aptr"),
        _t(64, 128, 4, "ptr"), _t(64, 64, 4, "ptr"), _t(64, 64, 4, "nospec"),
    ]),
    (1, 4096, 7168): dict([  # auto: tma 64x128 s4 st5 (32 tiles x 4 splits)
        _t(64, 128, 5, "aptr", 4), _t(64, 128, 5, "ptr", 4), _t(16, 128, 5, "tma", 4), _t(64, 128, 5, "pad", 4),
        _t(16, 64, 5, "tma", 4), _k(64, 32, 4, 4, 1, True),  # the Gluon ones with an 8-row A box (a_box_rows)
    ]),
    (1, 2112, 7168): dict([  # auto: tma 64x64 s4 st5 (33 tiles x 4 splits)
        _t(64, 64, 5, "aptr", 4), _t(64, 64, 5, "ptr", 4), _t(16, 64, 5, "tma", 4), _t(64, 64, 5, "pad", 4),
        _k(64, 32, 4, 4, 2, True), _k(64, 32, 4, 4, 4, True),
    ]),
    # M = 16 and 32 (the rest of the m16 / m32 buckets): the TMA configs auto ran before A_PTR,
    # against A_PTR with the same tiles (and the other tile width at N = 24576)
    (16, 24576, 1536): dict([_t(64, 128, 4), _t(64, 128, 4, "aptr"), _t(64, 64, 4), _t(64, 64, 4, "aptr")]),
    (32, 24576, 1536): dict([_t(64, 128, 4), _t(64, 128, 4, "aptr"), _t(64, 64, 4), _t(64, 64, 4, "aptr")]),
    # and tiles of M rows (16 / 32: mma.sync, HMMA.16816 on fp8 converted to fp16; no spills,
    # 40-80 KB of shared memory for sm_90), DeepGEMM's choice there
    (16, 4096, 7168): dict([_t(64, 128, 5, "tma", 4), _t(16, 64, 5, "tma", 4), _t(16, 32, 5, "tma", 2),
                            _k(64, 32, 4, 4, 1, True), _k(64, 32, 8, 2, 1, True)]),
    (32, 4096, 7168): dict([_t(64, 128, 5, "tma", 4), _t(32, 64, 5, "tma", 2), _t(32, 32, 6, "tma", 1),
                            _k(64, 32, 4, 4, 1, True), _k(64, 32, 8, 2, 1, True)]),
    (32, 2112, 7168): dict([_t(64, 64, 5, "tma", 4), _t(64, 64, 5, "aptr", 4), _k(64, 32, 4, 4, 2, True)]),
    # second probe at K = 2048 (the first: tma 64x64 9.1 / 8.9 us, 16x64 9.0, 16x128 10.1, 32x64 10.2)
    # with the short A box (groupwise_gluon.a_box_rows), the Gluon and K-interleaved kernels
    (16, 7168, 2048): dict([_t(64, 64, 5, "aptr"), _g(64, 64, 6, 2), _g(64, 64, 4, 3), _g(64, 32, 8, 2),
                            _k(64, 64, 6, 2, 1, True), _k(64, 64, 6, 2)]),
    (32, 7168, 2048): dict([_t(64, 64, 5, "aptr"), _g(64, 64, 6, 2), _g(64, 64, 4, 3), _g(64, 32, 8, 2),
                            _k(64, 64, 6, 2, 1, True), _k(64, 64, 6, 2)]),
    (1, 7168, 2048): dict([_t(64, 64, 5, "aptr"), _g(64, 64, 6, 2), _k(64, 64, 6, 2, 1, True)]),
    (16, 2112, 7168): dict([_t(64, 64, 5, "aptr", 4), _k(64, 32, 4, 4, 2, True), _k(64, 32, 4, 4, 4, True)]),
}
_NOSPEC = {}


# Tried and removed (H200, interleaved, us; DG = DeepGEMM; auto = the default):
# (128, 2112, 7168) DG 10.7, auto 11.8; kint ROWS (128-row tile, warpgroup h rows 64h..64h+63 over
#   every stage) 128x64 st4 kps2 s4 e 15.4, st4 kps2 s4 15.5, st8 s4 15.5, 128x32 st4 kps2 s2 e 13.4.
# (128, 4096, 7168) DG 12.9, auto 14.1; ROWS 128x64 st4 kps2 s2 e 17.1, st4 kps2 s2 17.2, st8 s2 17.4,
#   128x128 st3 kps2 s4 e 22.9, st6 s4 22.8.
# (1, 24576, 1536) DG 14.6, auto (Triton 64x128) 15.6; Triton 64x64 st4 16.1, st3 19.1, 64x32 st4 26.9;
#   kint 64x64 st4 kps2 e 19.1, 64x32 st4 kps4 e 24.6, 64x128 st2 kps2 s2 e 20.5.
# (64, 4096, 7168) DG 11.7, auto 12.6; kint 64x32 st8 kps2 e 12.7.


def _operands(m, n, k, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    a = torch.randn(m, k, device=DEVICE, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=DEVICE, generator=g).to(torch.float8_e4m3fn)
    sa = torch.rand(m, k // 128, device=DEVICE, generator=g) * 0.01 + 0.001
    sb = torch.rand(-(-n // 128), k // 128, device=DEVICE, generator=g) * 0.01 + 0.001
    # MN-major scales, as benchmarks/bench_gemm.py times auto: [kb, m] and [kb, nb]
    return a, b, sa.t().contiguous(), sb.t().contiguous()


def _k_major(x):
    """The operands with K-major scales, as [kb, m] / [kb, nb] views."""
    a, b, sa_mn, sb_mn = x
    return a, b, sa_mn.t().contiguous().t(), sb_mn.t().contiguous().t()


def _mate_fn(x, out, cfg):
    from mate import gemm
    from mate.ops.gemm.groupwise import PLAIN, groupwise_gemm_triton

    a, b, sa_mn, sb_mn = x
    if cfg is None:
        return lambda: gemm.gemm_fp8_nt_groupwise(a, b, sa_mn, sb_mn, scale_major_mode="MN", out=out, backend="auto")
    a_mk, b_nk = sa_mn.t(), sb_mn.t()
    sa_str = (0, a_mk.stride(0), a_mk.stride(1))
    sb_str = (0, b_nk.stride(0), b_nk.stride(1))
    diag = cfg.get("DIAG")
    cfg = {k: v for k, v in cfg.items() if k != "DIAG"}
    fn = lambda: groupwise_gemm_triton(a, b, sa_mn, sa_str, sb_mn, sb_str, out, None, layout=PLAIN, config=cfg)
    return _diag_fn(diag, a, cfg, fn) if diag else fn


def _diag_fn(diag, a, cfg, fn):
    """``fn`` run with one global of the groupwise module swapped for the call (the CUDA graph
    captures the launch made inside): ``pad``: ``_desc`` builds A's descriptor over a copy of
    ``a`` zero-padded to a multiple of BLOCK_M rows (M is still a's row count); ``nospec``: the
    TMA kernel compiled without specializing M, stride_asm and stride_ask (M == 1 otherwise
    becomes a constant)."""
    import triton

    from mate.ops.gemm import groupwise as gw

    if diag == "pad":
        rows = -(-a.shape[0] // cfg["BLOCK_M"]) * cfg["BLOCK_M"]
        a_pad = torch.zeros(rows, a.shape[1], dtype=a.dtype, device=a.device)
        a_pad[: a.shape[0]] = a
        desc = gw._desc
        name, value = "_desc", lambda t, rows_block: desc(a_pad if t is a else t, rows_block)
    elif diag == "nospec":
        if not _NOSPEC:
            _NOSPEC[0] = triton.jit(do_not_specialize=["M", "stride_asm", "stride_ask"])(
                gw.fp8_groupwise_tma_kernel.fn)
        name, value = "fp8_groupwise_tma_kernel", _NOSPEC[0]
    else:
        raise ValueError(f"unknown DIAG {diag!r}")

    def call():
        saved = getattr(gw, name)
        setattr(gw, name, value)
        try:
            fn()
        finally:
            setattr(gw, name, saved)

    return call


def _dg_fn(dg, x, out):
    a, b, sa_mn, sb_mn = x
    sa_dg = dg.get_mn_major_tma_aligned_tensor(sa_mn.t().contiguous())
    sb = sb_mn.t().contiguous()
    return lambda: dg.fp8_gemm_nt((a, sa_dg), (b, sb), out)


def _candidate(shape, name):
    """A candidate's config (also in the spawned workers, which see neither table's --kps swap)."""
    return {**CANDIDATES.get(shape, {}), **KPS_CANDIDATES.get(shape, {}), **KINT_CANDIDATES.get(shape, {}),
            **M1_CANDIDATES.get(shape, {}), **FLAT_CANDIDATES.get(shape, {})}[name]


def _warm(task):
    """Worker: one call of one implementation on one shape (fills the compile caches)."""
    shape, name = task
    t0 = time.time()
    try:
        x = _operands(*shape)
        out = torch.empty(shape[0], shape[1], dtype=torch.bfloat16, device=DEVICE)
        if name == "deepgemm":
            import deep_gemm

            _dg_fn(deep_gemm, x, out)()
        elif name.startswith("K-major "):
            _mate_fn(_k_major(x), out, _candidate(shape, name[8:]))()
        else:
            fn = _mate_fn(x, out, None if name == "auto" else _candidate(shape, name))
            fn()
            torch.cuda.synchronize()
            if name.startswith("kint"):  # many back-to-back runs: a race that faults fails here, not in the timing
                first = out.clone()
                for _ in range(200):
                    fn()
                torch.cuda.synchronize()
                if not torch.equal(first.view(torch.int16), out.view(torch.int16)):
                    return task, "FAILED: not deterministic over 200 back-to-back runs"
        torch.cuda.synchronize()
        return task, f"{time.time() - t0:.1f}s"
    except Exception as exc:
        return task, f"FAILED {type(exc).__name__}: {str(exc)[:150]}"


def _warm_all(tasks, deadline):
    """Runs the tasks in worker processes; returns those that failed (a fault stays in its worker)."""
    failed = set()
    ctx = mp.get_context("spawn")
    workers = min(12, max(1, (os.cpu_count() or 2) - 2), len(tasks))
    ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    futs = [ex.submit(_warm, t) for t in tasks]
    try:
        for f in cf.as_completed(futs, timeout=max(1.0, deadline - time.time())):
            task, msg = f.result()
            if msg.startswith("FAILED"):
                print(f"  warm-up {task}: {msg}", flush=True)
                failed.add(task)
    except cf.TimeoutError:
        print("  warm-up: deadline reached, the rest compiles in the timed process", flush=True)
    except cf.process.BrokenProcessPool as exc:
        print(f"  warm-up: a worker died ({exc}); unfinished tasks are skipped", flush=True)
        failed |= {t for f, t in zip(futs, tasks) if not f.done() or f.exception() is not None}
    ex.shutdown(wait=False, cancel_futures=True)
    return failed


def _check(fn, out, ref):
    out.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    first = out.clone()
    out.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    o = out.float()
    err = ((o - ref).abs().max() / ref.abs().max()).item()
    if torch.isnan(o).any():
        err = float("nan")
    return err, bool(torch.equal(first.view(torch.int16), out.view(torch.int16)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=105.0, help="seconds; later shapes are skipped past it")
    ap.add_argument("--only", default="", help="M,N,K of one shape, or several joined by ';'")
    ap.add_argument("--no-warm", action="store_true", help="skip the parallel compile warm-up")
    ap.add_argument("--kps", action="store_true", help="the KPS candidates (KPS_CANDIDATES) on their six shapes")
    ap.add_argument("--kint", action="store_true", help="the K-interleaved kernel (KINT_CANDIDATES), K = 7168")
    ap.add_argument("--m1", action="store_true", help="plain-Triton M = 1 candidates (M1_CANDIDATES, M1_SHAPES)")
    ap.add_argument("--flat", action="store_true", help="the single-partition kernel (FLAT_CANDIDATES, FLAT_SHAPES)")
    ap.add_argument("--warm-only", action="store_true",
                    help="only the warm-up; prints 'skip: JSON' (the [shape, impl] pairs that failed) for --skip")
    ap.add_argument("--skip", default="[]", help="JSON list of [[M, N, K], impl] pairs not to run (from --warm-only)")
    args = ap.parse_args()
    if args.kps or args.kint or args.m1 or args.flat:
        CANDIDATES.clear()
        CANDIDATES.update(KINT_CANDIDATES if args.kint else M1_CANDIDATES if args.m1 else
                          FLAT_CANDIDATES if args.flat else KPS_CANDIDATES)
    t0 = time.time()
    from mate.ops.gemm import reference as R
    from mate.ops.gemm import tuning
    from mate.testing.bench import rotation_count, time_interleaved

    shapes = [s for s in (M1_SHAPES if args.m1 else FLAT_SHAPES if args.flat else SHAPES)
              if s in CANDIDATES and (not args.only or ",".join(map(str, s)) in args.only.split(";"))]
    try:
        import deep_gemm as dg
    except Exception as exc:
        dg = None
        print(f"deep_gemm import failed: {type(exc).__name__}: {exc}"[:200])
    if not args.no_warm:
        tasks = [(s, "deepgemm") for s in shapes if dg is not None]
        tasks += [(s, "auto") for s in shapes] + [(s, n) for s in shapes for n in CANDIDATES[s]]
        tasks += [(s, "K-major " + next(iter(CANDIDATES[s]))) for s in shapes]
        failed = _warm_all(tasks, t0 + (0.9 if args.warm_only else 0.45) * args.budget)
        print(f"warm-up done at {time.time() - t0:.0f}s ({len(tasks)} tasks)", flush=True)
    else:
        failed = set()
    failed |= {(tuple(sh), name) for sh, name in json.loads(args.skip)}
    if args.warm_only:
        print("skip:", json.dumps(sorted([list(sh), name] for sh, name in failed)))
        return 0
    best, dg_us = {}, {}
    gbs = "wGB/s" if args.m1 else "GB/s"  # --m1: weight bytes (n * k) per second
    print(f"{'shape':>18} {'impl':>32} {'us':>7} {'TFLOP/s':>8} {gbs:>6} {'DG/t':>5} {'maxrel':>8} det  note")
    for shape in shapes:
        if time.time() - t0 > args.budget:
            print(f"{str(shape):>18} skipped: budget spent")
            continue
        m, n, k = shape
        byts = m * k + n * k + 2 * m * n + 4 * (m + n // 128 + 1) * (k // 128)
        shown = n * k if args.m1 else byts
        flops = 2.0 * m * n * k
        sets = [_operands(m, n, k, seed=i) for i in range(rotation_count(byts, max_sets=16))]
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device=DEVICE) for _ in sets]
        a, b, sa_mn, sb_mn = sets[0]
        ref = R.groupwise_fp32_ref(a, b, sa_mn.t(), sb_mn.t()).float()
        cases, checks, notes = {}, {}, {}
        auto_cfg = tuning.groupwise_config(m, n, k, False)
        notes["auto"] = (f"{tuning.groupwise_backend(m, n, k)} {auto_cfg['BLOCK_M']}x{auto_cfg['BLOCK_N']} "
                         f"s{auto_cfg['SPLIT_K']} st{auto_cfg['num_stages']} w{auto_cfg['num_warps']}")
        if "GLUON" in auto_cfg:
            g = {**auto_cfg, **auto_cfg["GLUON"]}
            notes["auto"] = (f"{'kint' if g.get('KINT') else 'gluon'} {g['BLOCK_M']}x{g['BLOCK_N']} "
                             f"st{g['num_stages']} kps{g.get('KPS', 1)}"
                             + (f" s{g['SPLIT_K']}" if g.get("KINT") and g["SPLIT_K"] > 1 else "")
                             + (" e" if g.get("EAGER") else "") + " (Hopper)")
        impls = {"auto": None, **CANDIDATES[shape]}
        for name, cfg in impls.items():
            if (shape, name) in failed or (shape, "K-major " + name) in failed:
                notes[name] = "skipped: failed in the warm-up"
                continue
            try:
                fns = [_mate_fn(x, o, cfg) for x, o in zip(sets, outs)]
                checks[name] = _check(fns[0], outs[0], ref)
                cases[name] = fns
                if name == next(iter(CANDIDATES[shape])):  # the first candidate also with K-major scales
                    k_err, _ = _check(_mate_fn(_k_major(sets[0]), outs[0], cfg), outs[0], ref)
                    notes[name] = f"K-major {k_err:.1e}" + ("" if k_err < 1e-2 else " FAIL")
            except Exception as exc:
                notes[name] = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
        if dg is not None and (shape, "deepgemm") not in failed:
            try:
                fns = [_dg_fn(dg, x, o) for x, o in zip(sets, outs)]
                checks["deepgemm"] = _check(fns[0], outs[0], ref)
                cases["deepgemm"] = fns
            except Exception as exc:
                notes["deepgemm"] = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
        times = time_interleaved(cases, rounds=5, iters=400) if cases else {}
        t_dg = times.get("deepgemm")
        t_dg = t_dg if isinstance(t_dg, float) else None
        dg_us[shape] = t_dg
        for name in list(impls) + ["deepgemm"]:
            t = times.get(name)
            note = notes.get(name, "")
            if not isinstance(t, float):
                note = note or (f"{type(t).__name__}: {str(t)[:120]}" if t is not None else "not run")
                print(f"{str(shape):>18} {name:>32} {'-':>7} {'':>8} {'':>6} {'':>5} {'':>8} {'':>3}  {note}")
                continue
            err, det = checks[name]
            if name != "deepgemm" and det and err < 1e-2:
                best.setdefault(shape, {})[name] = t
            ratio = f"{t_dg / t:5.2f}" if t_dg else "  -  "
            print(f"{str(shape):>18} {name:>32} {t:7.1f} {flops / t / 1e6:8.0f} {shown / t / 1e3:6.0f} {ratio} "
                  f"{err:8.1e} {'yes' if det else 'NO ':>3}  {note}", flush=True)
        del sets, outs, cases
        torch.cuda.empty_cache()
    print("summary (correct and deterministic only): auto, fastest candidate, DeepGEMM")
    for shape, res in best.items():
        name = min((n for n in res if n != "auto"), key=res.get, default=None)
        t_dg = dg_us.get(shape)
        line = f"{str(shape):>18} auto {res.get('auto', float('nan')):6.1f} us"
        if name:
            line += f"  best {name} {res[name]:6.1f} us"
            if t_dg:
                line += f" ({t_dg / res[name]:.2f}x DeepGEMM {t_dg:.1f} us)"
        print(line)
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
