"""Probe: the persistent Gluon GEMM on the MoE layouts off the bar shapes.

Contiguous layout: from how many output tiles it should run the Gluon kernel
(``tuning.GLUON_GROUPED_MIN_TILES``). Session 13 measured Gluon ahead of the Triton kernel
from 1024 to 8192 tiles (the threshold's docstring has the figures) and set the threshold
to 1024; the shapes here go below it (256-896 tiles) with one measured shape for reference.
Timed: the Triton kernel forced (threshold out of reach), the Gluon kernel forced
(threshold 0), DeepGEMM; the two kernels checked against each other.

Masked layout: the Gluon kernel on the G x max_m rows (``gluon_masked_supported``, opt-in)
against auto's Triton kernel and DeepGEMM, each Gluon config checked against auto on the
valid rows. Session 13: Gluon slower than the Triton kernel at 32 x 256 / expected 128
(548.3 against 524.0 us) and 64 x 128 / 64 (611.2 against 554.3), even at 256 x 64 / 32
(1865.7 against 1867.5), so the masked layout keeps the Triton kernel. Session 22, against the
Triton kernel's 64x128 tiles (auto since session 21), us: 32 x 256 / 128 auto 389.4, Gluon
128x192 525.3, 128x128 566.0, 64x128 615.6; 64 x 128 / 64 536.9 against 582.8 / 620.0 / 795.1;
256 x 64 / 32 1785.8 against 1786.9 / 1785.9 / 1915.1: no Gluon config is ahead.

    python benchmarks/probe_moe_gluon.py [grouped] [masked]
"""

from __future__ import annotations

import sys
from unittest import mock

import torch

from mate import gemm
from mate.ops.gemm import tuning
from mate.testing.bench import time_interleaved, times_line
from mate.testing.inputs import moe_contiguous_operands, moe_masked_operands
from mate.testing.numeric import rel_error

GROUPED_SHAPES = ((4, 256, 4096, 7168), (8, 256, 4096, 7168), (4, 512, 4096, 7168), (16, 128, 7168, 2048),
                  (8, 128, 7168, 2048), (4, 1024, 4096, 7168))


def _with_threshold(call, tiles: int):
    return mock.patch.object(tuning, "GLUON_GROUPED_MIN_TILES", tiles)(call)


def _grouped_shape(G: int, rows: int, n: int, k: int, dg) -> str:
    m = G * rows
    a, sa, b, sb, idx = moe_contiguous_operands(G, rows, n, k)
    outs = {name: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for name in ("triton", "gluon", "dg")}

    def call(o):
        return lambda: gemm.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, idx, out=o)

    cases = {"triton": _with_threshold(call(outs["triton"]), 1 << 62), "gluon": _with_threshold(call(outs["gluon"]), 0)}
    if dg is not None:
        sa_dg = dg.get_mn_major_tma_aligned_tensor(sa)
        cases["deepgemm"] = lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a, sa_dg), (b, sb), outs["dg"], idx)
    for f in cases.values():
        f()
    err = rel_error(outs["gluon"], outs["triton"])
    assert err < 1e-2, f"Gluon against Triton: rel error {err:.1e}"
    times = time_interleaved(cases, rounds=10, iters=100)
    tiles = -(-m // 128) * -(-n // 128)
    flops = 2.0 * m * n * k
    line = times_line(times, flops)
    return f"G={G:3d} x {rows:5d} rows N={n} K={k} ({tiles:5d} tiles)  {line}  gluon vs triton rel {err:.1e}"


# (G, max_m, expected_m, N, K)
MASKED_SHAPES = ((32, 256, 128, 4096, 7168), (64, 128, 64, 4096, 7168), (256, 64, 32, 4096, 7168))
MASKED_CONFIGS = {
    "gluon 128x192 st4 tma": {"BLOCK_M": 128, "BLOCK_N": 192, "num_stages": 4, "EPI_TMA": True},
    "gluon 128x128 st5 tma": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 5, "EPI_TMA": True},
    "gluon 64x128 st6": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 6},
}


def _with_gluon(call, overrides):
    real = tuning.masked_config

    def config(expected_m, n, k):
        return {**real(expected_m, n, k), "GLUON": overrides}
    return mock.patch.object(tuning, "masked_config", config)(call)


def _masked_shape(G, max_m, expected_m, n, k, dg) -> str:
    a, sa, b, sb, masked_m = moe_masked_operands(G, max_m, expected_m, n, k)
    outs = {name: torch.zeros(G, max_m, n, dtype=torch.bfloat16, device="cuda")
            for name in ["auto", *MASKED_CONFIGS, "dg"]}

    def call(o):
        return lambda: gemm.batch_deepgemm_fp8_nt_groupwise(a, b, sa, sb, masked_m, expected_m, out=o)

    cases = {"auto": call(outs["auto"])}
    for name, cfg in MASKED_CONFIGS.items():
        cases[name] = _with_gluon(call(outs[name]), cfg)
    if dg is not None:
        sa_dg = dg.get_mn_major_tma_aligned_tensor(sa)
        cases["deepgemm"] = lambda: dg.m_grouped_fp8_gemm_nt_masked((a, sa_dg), (b, sb), outs["dg"], masked_m,
                                                                     expected_m)
    for f in cases.values():
        f()
    valid = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    errs = {name: rel_error(outs[name][valid], outs["auto"][valid]) for name in MASKED_CONFIGS}
    for name, err in errs.items():
        assert err < 1e-2, f"{name} against auto: rel error {err:.1e}"
    times = time_interleaved(cases, rounds=10, iters=100)
    flops = 2.0 * int(masked_m.sum()) * n * k
    line = times_line(times, flops)
    return f"G={G} max_m={max_m} expected_m={expected_m} N={n} K={k}: {line}"


def main() -> None:
    from bench_gemm import _deep_gemm  # benchmarks/ is on the path when this runs as a script

    dg, note = _deep_gemm()
    if dg is None:
        print(note)
    parts = sys.argv[1:] or ["grouped", "masked"]
    if "grouped" in parts:
        for shape in GROUPED_SHAPES:
            print(_grouped_shape(*shape, dg), flush=True)
    if "masked" in parts:
        for shape in MASKED_SHAPES:
            print(_masked_shape(*shape, dg), flush=True)


if __name__ == "__main__":
    main()
