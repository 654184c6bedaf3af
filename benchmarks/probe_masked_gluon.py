"""Probe: the masked MoE layout on the persistent Gluon kernel (``gluon_masked_supported``:
the G x max_m rows as one row space, tiles past ``masked_m`` skipped) against auto's Triton
kernel and DeepGEMM.

Session 12 measured the Triton kernel at 0.64x DeepGEMM with 32 experts x max_m 256 at
expected_m 128 (517.1 against 330.8 us) and at 0.98x on the 64 x 128 bar shape. This times,
interleaved, auto and the Gluon configs below (each checked against auto on the valid rows)
on the masked shapes of ``bench_gemm.py``.

    python benchmarks/probe_masked_gluon.py
"""

from __future__ import annotations

import torch

from mate import gemm
from mate.ops.gemm import tuning
from mate.testing.bench import time_interleaved
from mate.testing.inputs import moe_masked_operands
from mate.testing.numeric import rel_error

SHAPES = ((32, 256, 128, 4096, 7168), (64, 128, 64, 4096, 7168), (256, 64, 32, 4096, 7168))  # G, max_m, expected_m
CONFIGS = {
    "gluon 128x192 st4 tma": {"BLOCK_M": 128, "BLOCK_N": 192, "num_stages": 4, "EPI_TMA": True},
    "gluon 128x128 st5 tma": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 5, "EPI_TMA": True},
    "gluon 64x128 st6": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 6},
}


def _with_gluon(call, overrides):
    def run():
        real = tuning.masked_config

        def config(expected_m, n, k):
            return {**real(expected_m, n, k), "GLUON": overrides}
        tuning.masked_config = config
        try:
            call()
        finally:
            tuning.masked_config = real
    return run


def _shape(G, max_m, expected_m, n, k, dg) -> str:
    a, sa, b, sb, masked_m = moe_masked_operands(G, max_m, expected_m, n, k)
    outs = {name: torch.zeros(G, max_m, n, dtype=torch.bfloat16, device="cuda") for name in ["auto", *CONFIGS, "dg"]}

    def call(o):
        return lambda: gemm.batch_deepgemm_fp8_nt_groupwise(a, b, sa, sb, masked_m, expected_m, out=o)

    cases = {"auto": call(outs["auto"])}
    for name, cfg in CONFIGS.items():
        cases[name] = _with_gluon(call(outs[name]), cfg)
    if dg is not None:
        sa_dg = dg.get_mn_major_tma_aligned_tensor(sa)
        cases["deepgemm"] = lambda: dg.m_grouped_fp8_gemm_nt_masked((a, sa_dg), (b, sb), outs["dg"], masked_m,
                                                                     expected_m)
    for f in cases.values():
        f()
    valid = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    errs = {name: rel_error(outs[name][valid], outs["auto"][valid]) for name in CONFIGS}
    for name, err in errs.items():
        assert err < 1e-2, f"{name} against auto: rel error {err:.1e}"
    times = time_interleaved(cases, rounds=10, iters=100)
    flops = 2.0 * int(masked_m.sum()) * n * k
    line = "  ".join(f"{name} {t:7.1f} us {flops / t / 1e6:5.0f} TF" if isinstance(t, float) else f"{name} {t}"
                     for name, t in times.items())
    return f"G={G} max_m={max_m} expected_m={expected_m} N={n} K={k}: {line}"


def main() -> None:
    from bench_gemm import _deep_gemm  # benchmarks/ is on the path when this runs as a script

    dg, note = _deep_gemm()
    if dg is None:
        print(note)
    for shape in SHAPES:
        print(_shape(*shape, dg), flush=True)


if __name__ == "__main__":
    main()
