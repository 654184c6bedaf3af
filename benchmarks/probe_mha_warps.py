"""Probe: warps per program of the mha Triton kernel (``mate.ops.mha.attention.mha_num_warps``).

At d = 128 the 64-row program with 4 warps compiles for sm_90 to 255 registers and 120 spill
instructions; with 8 warps to 254 and none (two programs per SM against one). This times both
on the H200, interleaved, for the Triton paths that run it: a ragged causal prefill (8 x 2048,
32 heads) and one 16K sequence with the LSE (the SDPA path does not return one), plus the paged
decode (16-row programs, left at 4 warps) as a control. H200, 2026-11-30 (us, 4 / 8 warps):
8 x 2048 causal 989.9 / 2045.9, 16K causal + LSE 6495.4 / 13593.8, paged decode 888.9 / 887.7;
4 warps stay.

    python benchmarks/probe_mha_warps.py
"""

from __future__ import annotations

import torch

from mate.mha_interface import flash_attn_varlen_func, flash_attn_with_kvcache
from mate.ops.mha import attention
from mate.testing.bench import time_interleaved


def main() -> None:
    torch.manual_seed(0)
    T, H, D = 16384, 32, 128
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    cu1 = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    cu8 = torch.arange(0, T + 1, T // 8, dtype=torch.int32, device="cuda")
    B, ctx, page, HQ, HKV = 128, 8192, 16, 32, 8
    kc = torch.randn(B * ctx // page, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(B * ctx // page, device="cuda").to(torch.int32).view(B, -1)
    qd = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    cases = {
        "8 x 2048 causal": lambda: flash_attn_varlen_func(q, k, v, cu8, cu8, T // 8, T // 8, causal=True, out=out),
        "16K causal + LSE": lambda: flash_attn_varlen_func(q, k, v, cu1, cu1, T, T, causal=True, out=out,
                                                           return_softmax_lse=True),
        "paged decode B=128 8K": lambda: flash_attn_with_kvcache(qd, kc, kc, cache_seqlens=lens, page_table=table),
    }
    real = attention.mha_num_warps
    variants = {"4 warps (default)": real, "8 warps at 64 rows": lambda bm, d: 8 if bm >= 64 else real(bm, d)}
    ref = {name: fn() for name, fn in cases.items()}
    for name, fn in cases.items():
        fns = {}
        for label, rule in variants.items():
            def run(rule=rule, fn=fn):
                attention.mha_num_warps = rule
                try:
                    return fn()
                finally:
                    attention.mha_num_warps = real
            got = run()
            a, b = (got[0], ref[name][0]) if isinstance(got, tuple) else (got, ref[name])
            assert torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2), (name, label)
            fns[label] = run
        times = time_interleaved(fns, iters=10)
        shown = (f"{t:9.1f} us" if isinstance(t, float) else f"failed: {t}"[:60] for t in times.values())
        print(f"{name:24} " + "  ".join(f"{label} {t}" for label, t in zip(times, shown)), flush=True)


if __name__ == "__main__":
    main()
