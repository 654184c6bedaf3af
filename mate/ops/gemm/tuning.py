"""The ``backend="auto"`` table of the GEMM family and the Triton configs per shape class.

The table maps a shape class (an M bucket, optionally refined by (N, K)) to the faster
backend on the H200 and the Triton config to use. ``benchmarks/tune_gemm.py`` measures
both backends on the GPU and rewrites the block between the ``BEGIN TABLE`` and
``END TABLE`` markers below.

Provenance of the committed table: the H200 request of 2026-11-29 (phase 1 of the groupwise
work: every DeepSeek-V3 (N, K) at M = 1, 16, 64, 128, each candidate beside cuBLAS blockwise and
DeepGEMM, CUDA-graph replay over rotated inputs). Each (bucket, N, K) takes its fastest correct
candidate; the bucket default is the one that wins most shapes. M <= 16: 64x128 tiles (e.g.
(7168, 16384) 38.3 us vs 55.6 with 64x64; (4096, 7168) 14.4 vs 16.7), 64x64 on (2112, 7168)
10.8 and (7168, 2048) 9.6. M = 64: 64x64 tiles, 64x128 on (32768, 512) 9.6 vs 11.0 and
(7168, 16384) 38.8 vs 45.6. M = 128: 64x128 tiles ((7168, 16384) 52.6 vs cuBLAS 53.3,
(7168, 2048) 10.1 vs 10.5); 64x64 with two waves of split-K programs on (4096, 7168) 16.9 vs
21.0 (one wave) and (2112, 7168) 13.3; 64x128 with 3 stages (3 CTAs per SM) on (24576, 1536)
16.2 vs cuBLAS 17.6; cuBLAS on (32768, 512) 11.3 vs 13.4. 64x256 tiles and lagged scaling
(MMA_LAG) won no shape by more than 3%. m32 started as a copy of m16; its A_PTR choices are
measured (below). M >= 256 rows are from the first H200 run (cuBLAS 112-280 us vs Triton
195-485 us at M=4096; buckets 256-2048 were not measured and go to cuBLAS).
``backend="cublas"`` through mate re-lays out one scale tensor (~2 us measured).
Regenerate with ``python benchmarks/tune_gemm.py --write`` on the GPU.

A_PTR at M <= 32 (H200 2026-11-29, ``bench_gemm_smallm.py --m1``, same method; us, TMA
config / the same tiles with A_PTR / DeepGEMM): a 64-row TMA box of A that is all out of
bounds but M rows costs ~2 us per tile stream at M = 1 (a diagnostic launch over a zero-padded
64-row copy of A ran as fast as M = 64), so the m16 bucket loads A by masked pointer loads:
(1, 24576, 1536) 15.6 (64x128) / 12.4 (64x64) / 14.5, (1, 4096, 7168) 14.1 / 12.9 / 14.7,
(1, 2112, 7168) 10.1 / 9.2 / 12.7, (16, 24576, 1536) 64x64 13.1 / 14.9 DeepGEMM, (16, 7168,
2048) 9.1 / 8.3 / 7.3; but (16, 4096, 7168) 13.7 / 14.0 / 12.4 and (32, 4096, 7168) 14.0 /
15.2 / 12.5, so m32 keeps TMA except (32, 24576, 1536) 64x64 15.1 / 13.4 / 15.1 and (32,
2112, 7168) 10.1 / 10.0 / 10.7. Rows 16-32 at (4096, 7168) and (7168, 2048) ran 0.87-0.90x
DeepGEMM with any 64-row tile. 16-row tiles (``tma 16xBN``, mma.sync: HMMA.16816 on fp8 converted
to fp16) won (4096, 7168) at M <= 16: 16x64 s4 12.6 / DeepGEMM 12.3 at M = 16 and 11.9 / 14.5 at
M = 1 (64x128 TMA 13.6 and 12.9 with A_PTR); 32-row tiles lost everywhere (32x64 s2 17.0 at (32,
4096, 7168), 32x32 10.3 at (32, 7168, 2048)). The rest of M <= 32 went to the Gluon kernels
(``GROUPWISE_GLUON``), once A's TMA box stopped at the rows of M.

Small-M sweep (H200 2026-11-29, ``benchmarks/bench_gemm_smallm.py``: interleaved graph replays,
rotated inputs; us, ``BMxBN sSPLIT stSTAGES``; every candidate within 3.4e-3 and deterministic;
the split-K candidates beside auto ran the FAST_REDUCE reduce, bitwise the same sum):

    (M, N, K)          auto                 DeepGEMM  DG/auto  best other candidates
    64, 2112, 7168     64x64 s4 st5   10.9   9.9     0.90     s4 st8 11.0; 64x32 s2 st8 12.4; 64x16 s1 16.5
    64, 4096, 7168     64x64 s2 st5   15.3  12.0     0.78     s2 st6 14.5; 64x64 s4 st6 15.4; 64x128 s4 15.9
    128, 2112, 7168    64x64 s4 st5   13.0  10.8     0.83     s4 st6 13.1; 128x32 s2 14.1; 128x64 s4 14.2
    128, 4096, 7168    64x64 s2 st5   16.8  13.1     0.78     s2 st6 16.6; 128x64 s2 18.0; 128x32 s1 20.1
    64, 24576, 1536    64x64 s1 st4   14.1  14.8     1.05     64x128 s1 st4 14.4
    128, 24576, 1536   64x128 s1 st3  15.8  15.8     1.00     64x64 s1 19.3; 128x128 w8 24.5

No tile, split-K or stage choice of the Triton kernel reaches 0.95x DeepGEMM at K = 7168 (the
best candidate of each shape: 0.79-0.91), and a split-K reduce with all partial loads in flight
(a FAST_REDUCE option, since removed) gained nothing.

DeepGEMM's schedule at K = 7168 and 2048 (DG_PRINT_CONFIGS, H200) uses no multicast: 64-row
tiles with narrow columns (64x16 / 64x32 / 64x64, 13-16 stages; 64x112 at (128, 7168, 2048)),
one wave, one TMA and one math warpgroup, full K (no split-K); only (64, 24576, 1536) runs a
2-CTA cluster (64x96). The Gluon kernel (``groupwise_gluon.py``) with that schedule, the scales copied
into the TMA ring by the producer, still reaches only 0.72-0.79x DeepGEMM at K = 7168, below
the Triton kernel's split-K; where it wins (K = 2048) ``GROUPWISE_GLUON`` selects it.
Measured (H200, same bench, MN-major scales; us; DG/t = DeepGEMM time / time; ``c1``: one
math warpgroup on a 64-row tile, ``c2``: two, splitting its columns (64 rows) or rows
(128); ``ring``: scales in the ring; all within 3.4e-3 and deterministic):

    (M, N, K)          auto (Triton)        best Gluon                  DeepGEMM
    64, 2112, 7168     10.8                 64x16 c1 ring st16 13.6     9.9  (no ring: 28.6)
    64, 4096, 7168     14.1                 64x32 c1 ring st16 14.8     11.7
    128, 2112, 7168    12.7                 64x32 c1 ring st16 14.3     10.8
    128, 4096, 7168    16.4                 64x64 c1 ring st13 16.8     12.9 (128x32 c2 19.5)
    64, 7168, 2048     8.9 (64x64 st5)      64x64 c1 / c2 ring 8.2/8.3  7.2  -> Gluon 64x64 c2
    128, 7168, 2048    9.6 (64x128 st5)     128x64 c2 ring st8 9.2      8.7  -> Gluon 128x64 c2
    64, 24576, 1536    13.5                 64x128 c2 ring st8 15.4     14.3
    128, 24576, 1536   15.3                 128x128 c2 ring st6 18.0    15.4 (128x192 st4 28.3)

The one-warpgroup tile (c1) is removed: where Gluon wins, c2 is within 0.1 us of it (8.3 vs
8.2); at K = 7168 it beat c2 (64x32: 14.8 vs 15.7 us) but not the Triton kernel.
ncu at (64, 4096, 7168) put 41% of the Gluon kernel's stall cycles at CTA barriers (Triton
puts a bar.sync before each mbarrier arrive and wait, two per K block). With two or four K
blocks per ring stage (``KPS``; one wait and one arrival per stage) the same run measured (us,
auto / KPS 1 / KPS 2 / KPS 4 / DeepGEMM): (64, 2112, 7168) 10.8 / 15.1 / 14.0 / 13.4 / 9.9;
(64, 4096, 7168) 14.4 / 15.9 / 15.0 / 14.5 / 11.8; (128, 2112, 7168) 12.4 / 15.5 / 14.4 / 13.8
/ 10.8; (128, 4096, 7168) 16.5 / 16.8 (64x64 st13) / 16.0 (64x64 st6) / - / 13.1; so the
barriers cost 7-12% there but do not explain the gap to DeepGEMM at K = 7168 (0.74-0.82x).
The grouped 128x192 shape did not change (1878.7 us with KPS 2 against 1872.3).
A swap-AB Gluon kernel without multicast (weights on the wgmma M side, TMA ring, split-K
reduced by the last, every or a second program) was tried and removed: on the H200
(2026-11-29, same bench; us, auto / best Triton candidate / best Gluon / DeepGEMM) (64, 2112,
7168) 10.8 / 10.6 (s4 st8) / 14.3 / 9.9, (64, 4096, 7168) 15.0 / 14.2 (s2 st6) / 20.2 / 11.8,
(128, 2112, 7168) 12.7 / 12.6 (s4 st6) / 16.4 / 10.7, (128, 4096, 7168) 16.4 / 16.4 (s2 st6)
/ 22.9 / 12.8, (64, 24576, 1536) 13.8 / 17.3 (64x64 s1 st6) / 16.6 / 14.5, (128, 24576,
1536) 15.4 / 19.4 (64x128 s1 st4) / 23.8-26.6 / 15.4. From that run and the sweep above,
28 K blocks per split take 6 stages (``_stages``: s2 st6 against st5 at (64, 4096, 7168)
14.2 vs 15.0 and 14.5 vs 15.3); s4 st8 at (64, 2112, 7168) (10.6 vs 10.8, 11.0 vs 10.9 in
the sweep) is within noise and not adopted.

The K-interleaved Gluon kernel (``groupwise_gluon_kint.py``: both math warpgroups own the
tile and take alternate ring stages of KPS K blocks, optional split-K over programs reduced
in split order by the tile's last unit; ``e``: EAGER, a stage's next wgmma issued before the
previous product is scaled) on the H200 (bench_gemm_smallm.py --kint, same method; us, DG/t;
every candidate within 3.4e-3 with both scale modes and bitwise repeatable):

    (M, N, K)          auto (Triton)   kint candidates                                DeepGEMM
    64, 2112, 7168     10.8 (0.91)     64x32 st4 kps4 s2 e 10.0 (0.98); st8 kps2 s2   9.8
                                       10.1, its e 10.1; 64x16 st8 kps2 e 10.8
    64, 4096, 7168     14.3 (0.82)     64x32 st4 kps4 e 12.5 (0.93); st8 kps2 12.6,   11.7
                                       its e 12.5; 64x64 st6 kps2 s2 e 14.1
    128, 2112, 7168    12.4 (0.86)     64x64 st6 kps2 s2 e 11.7 (0.91); without e     10.6
                                       11.8; 64x32 st8 kps2 e 11.9, st4 kps4 e 11.8;
                                       128x64 st6 s4 17.2
    128, 4096, 7168    16.4 (0.79)     64x64 st6 kps2 e 14.1 (0.91); without e 14.3;  12.9
                                       64x64 st4 kps3 e 14.5; 128x32 st4 kps2 e 19.3;
                                       128x64 st6 s2 18.2; 64x128 st6 s2 17.6

Session 16 swizzled the kernel's hand-over buffer (the 64x64 configs' warpgroup-to-warpgroup
fp32 tile had 8-way bank conflicts): (128, 2112 | 4096, 7168) 11.8 / 14.0 -> 11.3-11.5 /
13.5-13.7 us, 0.93-0.95x / 0.94-0.96x DeepGEMM over four runs; the configs stay the fastest.
Session 17's split-K reduce in which the last split waits for the others' partials (REDUCE
"wait", the launcher's default when every unit has its own program) took the two split
configs to (128, 2112, 7168) 10.9-11.0 us (0.98x DeepGEMM 10.8; 11.5 with the fused reduce)
and (64, 2112, 7168) 9.4 (1.05x; 9.9).

``GROUPWISE_GLUON`` selects the fastest (first) kint config of each shape for its M bucket
(33-64, 65-128 at N 2112 / 4096, K 7168: the same tile and unit counts as M 64 / 128); the
M <= 32 entries were measured there (see the comment above ``GROUPWISE_GLUON``).
"""

from __future__ import annotations

__all__ = [
    "M_BUCKETS",
    "m_bucket",
    "groupwise_backend",
    "groupwise_config",
    "grouped_config",
    "masked_config",
    "bmm_config",
    "bmm_fp8_backend",
    "NUM_SMS",
]

NUM_SMS = 132  # H200
M_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 1 << 62)

# BEGIN TABLE (generated by benchmarks/tune_gemm.py; edit by re-running it)
GROUPWISE_TABLE: dict[str, dict] = {
    "m16": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m32": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 6},
    "m64": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6},
    "m128": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 6},
    "m256": {"backend": "cublas", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
    "m512": {"backend": "cublas", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
    "m1024": {"backend": "cublas", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
    "m2048": {"backend": "cublas", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
    "m4096": {"backend": "cublas", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
    "mmax": {"backend": "cublas", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
}
# (bucket, n, k) overrides
GROUPWISE_OVERRIDES: dict[str, dict] = {
    "m16,2112,7168": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m16,24576,1536": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m16,7168,2048": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m16,4096,7168": {"backend": "triton", "BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "SPLIT_K": 4},
    "m32,2112,7168": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m32,24576,1536": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m32,7168,2048": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "A_PTR": True},
    "m64,32768,512": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 6},
    "m64,7168,16384": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 6},
    "m128,4096,7168": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "SPLIT_K": 2},
    "m128,2112,7168": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "SPLIT_K": 4},
    "m128,24576,1536": {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
    "m128,32768,512": {"backend": "cublas", "BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
}
# END TABLE


# (bucket, n, k): the Gluon kernel's config (``groupwise_gluon.py``), which replaces the Triton
# config above on Hopper GPUs (elsewhere, and for FP8 output, the Triton config runs).
# Measured on the H200 (bench_gemm_smallm, see the module docstring): (64, 7168, 2048) 8.3 us
# against 8.9 for Triton 64x64 st5; (128, 7168, 2048) 9.2 against 9.6 for Triton 64x128 st5.
# Two K blocks per ring stage (KPS 2: one wait and one arrival, so half the bar.syncs per K
# block) then took them to 8.0 (64x64 st6) and 8.9 (128x64 st4) against 8.3 / 9.3 for the
# KPS 1 configs and DeepGEMM's 7.2 / 8.7 in the same run (bench_gemm_smallm --kps).
# KINT: the K-interleaved kernel (``groupwise_gluon_kint.py``) at K = 7168 (measured in the
# module docstring: 0.91-0.98x DeepGEMM against 0.79-0.91x for the Triton config); it reads
# SPLIT_K and num_stages, so its entries set both (the Triton config's would apply otherwise).
# M <= 32 (H200 2026-11-29, bench_gemm_smallm --m1): with A's TMA box cut to the rows of M
# (groupwise_gluon.a_box_rows) the Gluon kernels run there as fast as at M = 64 (us, Triton
# auto before / Gluon / DeepGEMM): (1, 7168, 2048) 7.9 / 7.6 / 7.4, (16, 7168, 2048) 8.3 / 7.8 /
# 7.3, (32, 7168, 2048) 8.5 / 7.8 / 7.4; K-interleaved (1, 2112, 7168) 9.2 / 8.9 / 13.2, (16,
# 2112, 7168) 9.7 / 9.1 / 10.6, (32, 2112, 7168) 10.0 / 9.4 / 10.7, (32, 4096, 7168) 13.8 / 12.3
# / 12.4 (with the 64-row box it ran 16.2 there). (16, 4096, 7168) stays Triton 16x64 (12.3,
# K-interleaved 12.4).
# FLAT: the single-partition kernel (``groupwise_gluon_flat.py``: one warpgroup, no warp
# specialization, whose ~0.4 us region cost is the fixed gap to DeepGEMM at small M; H200
# 2026-11-30, ``bench_gemm_smallm.py --flat``: interleaved graph replays beside auto and
# DeepGEMM; us, auto before / FLAT / DeepGEMM): (1, 7168, 2048) 7.49 / 7.43 / 7.30, (16, 7168,
# 2048) 7.72 / 7.60 / 7.26, (32, 7168, 2048) 7.78 / 7.70 / 7.32 (64x64, 4 stages of 2 K blocks),
# (128, 7168, 2048) 8.92 / 8.76 / 8.69 (64x64, 3 x 2: two programs per SM), (16, 24576, 1536)
# 13.03 / 12.31 / 14.85 and (64, 24576, 1536) 13.85 / 13.24 / 14.36 (64x64, 2 x 2: three
# programs per SM; M 17-32 takes the same, between the two), (16, 32768, 512) 7.91 / 7.62 / 8.05
# (64x128, 2 x 2). Not adopted then: (128, 32768, 512) 12.61 (cuBLAS with a scale copy) / 11.89 /
# 10.50 (since session 12 auto runs it there when cuBLAS would copy a scale, see
# CUBLAS_NEEDS_IN_PLACE_SCALES). (64, 7168, 2048) took it later, from three runs
# (7.88 / 7.87 / 7.12, 8.0 / 7.8 / 7.2 and 8.0 / 7.9 / 7.2; 64x64, 4 x 2). At K = 7168 it lost to the K-interleaved kernel ((64, 4096,
# 7168) 14.65 against 12.63, (128, 2112, 7168) 13.84 against 11.71): one warpgroup's chain per K
# block (wait, wgmma, wait, scale) is not hidden there.
# K = 16384 (H200 2026-11-30, bench_gemm_smallm --kint after the GPU tests; us, Triton auto /
# K-interleaved / DeepGEMM): (64, 7168, 16384) 37.5 / 35.7 (64x64, 6 stages of 2, eager) / 36.4;
# (128, 7168, 16384) 48.3 / 46.6 (128x64, 6 stages: B read once) / 45.8. Lost there: 64x128 st2
# kps3 (41.8 / 55.9), 64x32 st4 kps4 (44.1 at M = 64), 64x64 st6 kps2 at M = 128 (51.7, two waves).
# EAGER in the single-partition kernel (a stage's next wgmma issued before the previous product
# is scaled; H200 2026-11-30 session 12, bench_gemm_smallm --flat; us, auto before / FLAT eager /
# DeepGEMM): (1, 7168, 2048) 7.5 / 7.0 / 7.4, (16, 7168, 2048) 7.7 / 7.3 / 7.3 (4 x 2), (32, 7168,
# 2048) 7.8 / 7.3 / 7.4, (64, 7168, 2048) 7.9 / 7.6 / 7.1 (3 x 4), (128, 7168, 2048) 8.7 / 8.4 /
# 8.7 (3 x 2), (16, 24576, 1536) 12.5 / 12.3 / 14.8 (2 x 2; 64 rows: 13.2 either way), (128,
# 32768, 512) 13.0 (cuBLAS with a weight-scale copy) / 11.9 / 10.7 (64x128, 2 x 2; auto runs it
# when cuBLAS would re-lay a scale out: CUBLAS_NEEDS_IN_PLACE_SCALES). At K = 7168 the
# eager FLAT kernel still lost to the K-interleaved one ((64, 4096, 7168) 13.4 against 12.8,
# (128, 2112, 7168) 12.6 against 11.8).
# (64, 7168, 2048) since session 14: 64x32 tiles, 3 stages of 2 K blocks, eager (224 tiles, two
# programs and so two chains per SM, 74 KB each; the 64x64 tiles left 20 SMs idle): three
# interleaved runs of ``bench_gemm_smallm --flat`` (H200), GB/s 2116 / 2122 / 2109 against 2082 /
# 2085 / 2082 for 64x64 st3 kps4 and DeepGEMM's 2205 / 2205 / 2200 (7.4-7.5 against 7.6 us, DeepGEMM
# 7.1-7.2: 0.96x against 0.94x); 64x32 with 4 x 2 or 2 x 4 stages ran as 64x64 did.
# Stream-K in the single-partition kernel (tried and removed, H200 2026-11-30): at N = 7168, K =
# 2048 the 64x64 tiles leave 20 of 132 SMs idle (112 tiles, 224 at M = 128 on two programs per
# SM); 132 (264) programs taking equal runs of (tile, ring stage) units, with a split tile's
# fp32 partials summed in order by its last program (tested correct and deterministic, CUDA
# graph included), ran (16 | 32 | 64 | 128, 7168, 2048) in 11.6 | 12.1 | 13.2 | 13.5-17.5 us
# against 7.7 | 7.8 | 7.9 | 8.8 one program per tile: a split tile's fixup (partial stores, a
# GPU-scope fence, the counter's atomic round trip, the partials' loads) is a ~2 us latency
# chain per split segment, against the ~0.7 us of one ring stage it saves per program.
_FLAT_64X64 = {"FLAT": True, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 4, "KPS": 2, "EAGER": True}
_FLAT_64X64_ST2 = {"FLAT": True, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2, "KPS": 2}
_FLAT_64X128_ST2 = {"FLAT": True, "BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 2, "KPS": 2}
_KINT_64X32 = {"KINT": True, "BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 1, "EAGER": True}
_KINT_64X64 = {"KINT": True, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": 1, "EAGER": True}
GROUPWISE_GLUON: dict[str, dict] = {
    "m16,7168,2048": _FLAT_64X64,
    "m32,7168,2048": {**_FLAT_64X64, "num_stages": 3, "KPS": 4},
    "m64,7168,2048": {**_FLAT_64X64, "BLOCK_N": 32, "num_stages": 3, "KPS": 2},  # 224 tiles, 2 per SM
    "m128,7168,2048": {**_FLAT_64X64, "num_stages": 3},
    "m16,24576,1536": {**_FLAT_64X64_ST2, "EAGER": True},
    "m32,24576,1536": _FLAT_64X64_ST2,
    "m64,24576,1536": _FLAT_64X64_ST2,
    "m16,32768,512": _FLAT_64X128_ST2,
    "m128,32768,512": {**_FLAT_64X128_ST2, "EAGER": True},
    "m16,2112,7168": {**_KINT_64X32, "SPLIT_K": 2},
    "m32,2112,7168": {**_KINT_64X32, "SPLIT_K": 2},
    "m64,2112,7168": {**_KINT_64X32, "SPLIT_K": 2},
    "m32,4096,7168": _KINT_64X32,
    "m64,4096,7168": _KINT_64X32,
    "m128,2112,7168": {**_KINT_64X64, "SPLIT_K": 2},
    "m128,4096,7168": _KINT_64X64,
    # M <= 32 on M = 64's 112 tiles (session 15, us): M 16 33.0 / M 32 33.8 against Triton 35.7 / 36.7,
    # DeepGEMM 36.3 / 37.1
    "m16,7168,16384": _KINT_64X64,
    "m32,7168,16384": _KINT_64X64,
    "m64,7168,16384": _KINT_64X64,
    "m128,7168,16384": {"KINT": True, "BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 6, "KPS": 1, "SPLIT_K": 1},
}


def recipe_settings() -> tuple:
    """What of this module a GEMM launch recipe depends on (part of its key,
    ``mate.gemm``): the functions that choose backends and configurations, which benchmarks
    replace, and the ids of the tables. Editing a table in place (``tune_gemm.py``) does not show
    here: do it with recipes off (``mate._core.recipe.disabled()``)."""
    return (groupwise_backend, groupwise_config, fp8_out_two_step, grouped_config, masked_config,
            GLUON_GROUPED_MIN_TILES, id(GROUPWISE_TABLE), id(GROUPWISE_OVERRIDES), id(GROUPWISE_GLUON))


def m_bucket(m: int) -> str:
    for b in M_BUCKETS:
        if m <= b:
            return "mmax" if b == M_BUCKETS[-1] else f"m{b}"
    return "mmax"


def _entry(m: int, n: int, k: int) -> dict:
    key = m_bucket(m)
    return GROUPWISE_OVERRIDES.get(f"{key},{n},{k}", GROUPWISE_TABLE[key])


CUBLAS_NEEDS_IN_PLACE_SCALES = frozenset({"m128,32768,512"})
"""(bucket, n, k) where cuBLAS wins only when it reads both scales in place: re-laying a scale
out for it is one more launch (~2.5 us), and the Gluon kernel, which reads either layout in
place, is faster than that (H200 2026-11-30: 11.8 us against cuBLAS 10.5 with in-place scales,
13.0 with MN-major weight scales)."""


def groupwise_backend(m: int, n: int, k: int, scales_in_place: bool = True) -> str:
    """``"cublas"`` or ``"triton"``: the faster measured path for this shape class;
    ``scales_in_place``: whether cuBLAS would read both scales as given
    (``cublas.groupwise_scales_in_place``)."""
    key = f"{m_bucket(m)},{n},{k}"
    backend = _entry(m, n, k)["backend"]
    if backend == "cublas" and not scales_in_place and key in CUBLAS_NEEDS_IN_PLACE_SCALES:
        return "triton"
    return backend


def _split_k(tiles: int, k: int) -> int:
    """K splits that make about one wave of programs (measured best on the H200 at small M:
    33 tiles -> 4 splits, 64 tiles -> 2), keeping >= 4 K blocks per split."""
    kb = k // 128
    if tiles >= NUM_SMS:
        return 1
    return max(1, min(NUM_SMS // max(tiles, 1), kb // 4, 16))


def _stages(cap: int, k_blocks: int) -> int:
    """Pipeline depth for a K loop of ``k_blocks`` steps: deep pipelines pay off on long
    loops only (measured: 12 K blocks 4 stages 14.0 us vs 6 stages 17.5 us; 28 K blocks
    6 stages 14.2 us vs 5 stages 15.0 us; 56 K blocks 6 stages 16.6 us vs 4 stages 18.1 us)."""
    return min(cap, 4 if k_blocks <= 12 else 5 if k_blocks <= 16 else 6)


def groupwise_config(m: int, n: int, k: int, fp8_out: bool) -> dict:
    """Triton config for the plain groupwise kernel (BLOCK_N 128 for FP8 output).

    Keys: BLOCK_M, BLOCK_N, num_warps, num_stages, SPLIT_K, GROUP_M and, when the table
    holds them, REDUCE (``"fused"``/``"launch"``) and TMA (see ``groupwise_gemm_triton``);
    GLUON (a dict of Gluon overrides) for the shapes of ``GROUPWISE_GLUON``, bf16/fp16 output.
    The table's num_stages is a cap, lowered for short K loops (``_stages``).
    """
    e = dict(_entry(m, n, k))
    e.pop("backend", None)
    if fp8_out:
        e["BLOCK_N"] = 128
    tiles = -(-m // e["BLOCK_M"]) * -(-n // e["BLOCK_N"])
    # a measured split count is kept (capped by the K blocks); else the one-wave rule
    e["SPLIT_K"] = max(1, min(e["SPLIT_K"], k // 128)) if "SPLIT_K" in e else _split_k(tiles, k)
    if tiles >= NUM_SMS:
        e["SPLIT_K"] = 1
    e["num_stages"] = _stages(e["num_stages"], -(-(k // 128) // e["SPLIT_K"]))
    e["GROUP_M"] = 8
    gluon = GROUPWISE_GLUON.get(f"{m_bucket(m)},{n},{k}")
    if gluon is not None and not fp8_out:
        e["GLUON"] = dict(gluon)
    return e


FP8_OUT_TWO_STEP = frozenset({
    "m16,2112,7168", "m32,2112,7168", "m64,2112,7168", "m128,2112,7168",
    "m32,4096,7168", "m64,4096,7168", "m128,4096,7168",
    "m16,7168,2048", "m32,7168,2048", "m64,7168,2048", "m64,7168,16384",
})
"""(bucket, n, k) at M <= 128 where the FP8-output call runs faster as the bf16 call plus a
quantization launch than with the fused epilogue (H200, ``benchmarks/probe_gemm_fp8_out.py``,
interleaved, us, fused / two-step / bf16 output): (16, 2112, 7168) 11.7 / 11.0 / 9.1, (64, 2112,
7168) 17.3 / 12.5 / 10.4, (128, 2112, 7168) 21.9 / 14.5 / 12.4, (32, 4096, 7168) 15.0 / 14.9 /
12.8, (128, 4096, 7168) 18.5 / 18.1 / 15.5, (16, 7168, 2048) 10.0 / 9.1 / 7.2, (64, 7168, 2048)
11.9 / 10.2 / 8.0, (64, 7168, 16384) 38.4 / 37.5 / 35.2. The fused epilogue stays where a
second launch costs more than it saves: (16, 4096, 7168) 13.3 / 14.4, (128, 7168, 2048) 9.8 /
11.6, (128, 7168, 16384) 48.5 / 62.5, N = 24576 (0.82-0.94x) and N = 32768 (0.77-0.84x)."""


def fp8_out_two_step(m: int, n: int, k: int, bf16_backend: str) -> bool:
    """Whether ``auto`` runs an FP8-output call as the bf16 call (``bf16_backend``) followed by
    a quantization launch (``quantize.quantize_fp8_row_groups``) instead of the Triton kernel's
    fused epilogue: always where the bf16 path is cuBLAS (M >= 512 on the benchmark shapes:
    1.03-1.64x, e.g. (4096, 7168, 16384) 1323.3 / 807.6 us, (16384, 32768, 512) 1277.5 / 1069.6),
    and at the shapes of :data:`FP8_OUT_TWO_STEP`."""
    if bf16_backend == "cublas":
        return True
    return f"{m_bucket(m)},{n},{k}" in FP8_OUT_TWO_STEP


GLUON_GROUPED_MIN_TILES = 448
"""128x128 output tiles from which the contiguous layout runs the persistent Gluon kernel.
Measured on the H200 (``benchmarks/probe_moe_gluon.py``, session 13; Triton -> Gluon, us,
DeepGEMM in brackets; outputs bit-identical): 4 x 256 rows, N=4096, K=7168 (256 tiles)
74.8 -> 86.4 (62.4), the one loss; 8 x 128, N=7168, K=2048 (448) 54.3 -> 49.5 (41.8);
8 x 256 (512) 147.7 -> 132.4 (110.0); 4 x 512 (512) 144.0 -> 126.1 (102.1); 16 x 128,
N=7168 (896) 97.3 -> 86.4 (82.5); 4 x 1024 (1024) 275.5 -> 235.6 (193.7); 8 x 1024 (2048)
603.2 -> 443.5 (371.0); 32 x 256, N=7168, K=2048 (3584) 342.4 -> 254.3 (222.9)."""


def grouped_config(m: int, n: int, k: int) -> dict:
    """Contiguous MoE layout: groups are 128-row aligned, so BLOCK_M divides 128.

    From ``GLUON_GROUPED_MIN_TILES`` 128x128 tiles (more than three waves of a persistent
    grid) the persistent warp-specialized Gluon kernel (``groupwise_gluon.py``;
    Hopper only, elsewhere the option is ignored) with 128x192 tiles, 4 stages, the scales
    loaded one K block ahead and the TMA-store epilogue. Measured on the H200 (4 experts x
    8192 rows, N=4096, K=7168, interleaved in one run with DeepGEMM 1502 us = 1281 TFLOP/s;
    TFLOP/s, all within 3e-3 of the reference, padding rows untouched): 128x192 st4 ahead
    tma 1028.5 (1870.8 us); 128x192 st4 870, ahead 901; 128x128 st5 878 (2191.6 us), ahead
    893, tma 976, ahead tma 939; 128x256 st4 ahead 936, st3 ahead tma 1040 (within noise
    of 128x192, but it spills: removed). Earlier (2026-11-29): storing from the wgmma layout
    (4-byte pieces) instead of 16-byte row pieces -6%; 256x128 tiles with two 64-row waves
    per warpgroup, the next K block's wgmma issued before the scaling (ptxas serializes the
    wgmmas and spills), the next tile's m_indices loaded a tile ahead: no gain. DeepGEMM
    uses 128x192 tiles with 2-CTA TMA multicast, which Gluon in Triton 3.6 cannot express.
    The Triton kernel with 128x128 tiles, 8 warps, 4 stages: 874-935 TFLOP/s. On plain
    GEMMs with a few waves the Gluon kernel (128x128) was slower than the Triton kernel
    (M=4096, N=2112, K=7168: 180 us against 161), hence the tile threshold. ``GLUON`` holds
    the Gluon kernel's overrides of the Triton config (which runs where Gluon cannot).

    The Triton kernel's tile is 64x128 on one warpgroup, 4 stages (session 21, H200, interleaved,
    outputs bit-identical; us against the 128x128 8-warp tile before): 4 x 256 rows, N=4096,
    K=7168 68.8 against 74.4, 2 x 256 34.0 against 38.0, 8 x 128, N=7168, K=2048 51.5 against
    54.0 (Gluon 49.2), 8 x 256 141.2 against 147.6 (Gluon 133.1), 8 x 1024 541.5 against 593.1
    (Gluon 441.7), 4 x 8192 2214.7 against 2634.6 (Gluon 1779.2); 3 stages 0-4% slower.
    """
    triton_cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 4, "GROUP_M": 8}
    if -(-m // 128) * -(-n // 128) >= GLUON_GROUPED_MIN_TILES:
        return {**triton_cfg, "GLUON": {"BLOCK_M": 128, "BLOCK_N": 192, "num_stages": 4, "EPI_TMA": True}}
    return triton_cfg


def masked_config(expected_m: int, n: int, k: int) -> dict:
    """Masked MoE layout: 64x128 tiles on one warpgroup at every expected_m; 3 stages for
    32 < expected_m <= 256, else 4.

    Measured on the H200 (session 21, ``masked_m`` drawn from [expected_m / 2, 3 expected_m /
    2], N=4096, K=7168, interleaved, outputs bit-identical; us, 64x128 at 3 / 4 stages against
    the 128x128 8-warp tile used before for expected_m > 64): G=32 max_m=256 expected 128
    401.4 / 415.1 against 561.8 (484.9 against 401.2 at 4 stages in a second call), G=8 x
    256 / 128 104.8 / 112.2 against 146.8, G=16 x 512 / 256 320.8 / 327.4 against 376.3,
    G=8 x 1024 / 512 292.3 / 276.1 against 322.6, G=4 x 2048 / 1024 290.9 / 288.1 against
    314.0 (5 stages 1.3-1.4x slower everywhere; GROUP_M 4 / 16 within 3%). A third call, 3 / 4
    stages against 128x128: G=64 x 128 / 64 524.5 / 529.6 against 635.1, G=256 x 64 / 32 1812.2 /
    1794.0 against 2565.3, G=128 x 64 / 32 904.9 / 897.1 against 1237.7, G=32 x 256 / 128 388.6 /
    403.2 against 522.7. 64-row tiles pad a group's last tile less, and a 64x128 tile's program
    leaves room for more on an SM."""
    return {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3 if 32 < expected_m <= 256 else 4,
            "GROUP_M": 8}


def bmm_config(m: int, n: int, k: int, fp8: bool) -> dict:
    bk = 128 if fp8 else 64
    bm = 64 if m <= 64 else 128
    return {"BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": bk, "num_warps": 4 if bm == 64 else 8,
            "num_stages": 4, "GROUP_M": 8}


def bmm_fp8_backend(b: int, m: int, n: int, k: int) -> str:
    """Per-tensor bmm_fp8: cuBLAS takes 2-D operands only, so a batch is a loop of calls.

    Measured on the H200 (2026-11-29): b=1, 4096^3: cuBLAS 110 us vs Triton 123 us;
    b=8, 512x512x4096: the cuBLAS loop 61 us vs Triton 18 us.
    """
    return "cublas" if b == 1 else "triton"
