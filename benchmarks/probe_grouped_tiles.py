"""Probe: from how many output tiles the contiguous MoE layout should run the persistent
Gluon kernel (``tuning.GLUON_GROUPED_MIN_TILES``, 4096 128x128 tiles, set from the 4 x 8192
shape and a plain GEMM of 528 tiles where Gluon lost).

The session-12 benchmark ran the shapes under the threshold on the Triton kernel at 0.61-0.63x
DeepGEMM (8 x 1024 rows, N=4096, K=7168: 594.7 against 363.3 us; 32 x 256 rows, N=7168, K=2048:
355.4 against 222.3). This times, interleaved, auto (the table), the Gluon kernel forced
(threshold 0) and DeepGEMM on those and a few more shapes, and checks the forced kernel
against auto's output.

    python benchmarks/probe_grouped_tiles.py
"""

from __future__ import annotations

import torch

from mate import gemm
from mate.ops.gemm import tuning
from mate.testing.bench import time_interleaved
from mate.testing.inputs import moe_contiguous_operands
from mate.testing.numeric import rel_error

SHAPES = ((8, 1024, 4096, 7168), (32, 256, 7168, 2048), (16, 512, 4096, 7168), (64, 128, 7168, 2048),
          (4, 1024, 4096, 7168), (4, 8192, 4096, 7168))


def _forced_gluon(call):
    def run():
        before = tuning.GLUON_GROUPED_MIN_TILES
        tuning.GLUON_GROUPED_MIN_TILES = 0
        try:
            call()
        finally:
            tuning.GLUON_GROUPED_MIN_TILES = before
    return run


def _shape(G: int, rows: int, n: int, k: int, dg) -> str:
    m = G * rows
    a, sa, b, sb, idx = moe_contiguous_operands(G, rows, n, k)
    outs = {name: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for name in ("auto", "gluon", "dg")}

    def call(o):
        return lambda: gemm.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, idx, out=o)

    cases = {"auto": call(outs["auto"]), "gluon forced": _forced_gluon(call(outs["gluon"]))}
    if dg is not None:
        sa_dg = dg.get_mn_major_tma_aligned_tensor(sa)
        cases["deepgemm"] = lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a, sa_dg), (b, sb), outs["dg"], idx)
    for f in cases.values():
        f()
    err = rel_error(outs["gluon"], outs["auto"])
    assert err < 1e-2, f"forced Gluon against auto: rel error {err:.1e}"
    times = time_interleaved(cases, rounds=10, iters=100)
    tiles = -(-m // 128) * -(-n // 128)
    flops = 2.0 * m * n * k
    line = "  ".join(f"{name} {t:8.1f} us {flops / t / 1e6:6.0f} TF" if isinstance(t, float) else f"{name} {t}"
                     for name, t in times.items())
    return f"G={G:3d} x {rows:5d} rows N={n} K={k} ({tiles:5d} tiles)  {line}  gluon vs auto rel {err:.1e}"


def main() -> None:
    from bench_gemm import _deep_gemm  # benchmarks/ is on the path when this runs as a script

    dg, note = _deep_gemm()
    if dg is None:
        print(note)
    for shape in SHAPES:
        print(_shape(*shape, dg), flush=True)


if __name__ == "__main__":
    main()
