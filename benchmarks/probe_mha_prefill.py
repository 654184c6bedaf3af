"""Probe: prefill tilings of the mha Triton kernel (``mate.ops.mha.attention.PREFILL_VARIANT``).

The Triton prefill ran 0.52x of cuDNN SDPA at 16K causal with the LSE (6530 against 3419 us,
session 12) with 64-row, 4-warp programs that mask every key tile. This times, interleaved and
checked against the default's output, 128-row programs (8 warps: two warpgroups share each key
tile) and the split key loop (tiles every row of a program sees whole run without masks) on a
ragged causal prefill (8 x 2048, 32 heads), one 16K sequence with the LSE (the path that does
not go to SDPA) and the paged decode as a control (16-row programs: unchanged). Compiled for
sm_90 (benchmarks/compile_mha.py): 64 rows 198 registers, split 221; 128 rows 254, split 234;
no spills. (The same probe settled the warps of a 64-row program, session 12: 8 warps ran 2x
slower than 4; see ``mha_num_warps``.) Session 13 made the 64-row split loop the default and
sent the single-sequence LSE case to cuDNN (``mha_interface.SDPA_WITH_LSE``); the probe turns
that off for its 16K case, so the kernel is what it times.

    python benchmarks/probe_mha_prefill.py
"""

from __future__ import annotations

from unittest import mock

import torch

from mate import mha_interface
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
        "16K causal + LSE": mock.patch.object(mha_interface, "SDPA_WITH_LSE", False)(
            lambda: flash_attn_varlen_func(q, k, v, cu1, cu1, T, T, causal=True, out=out, return_softmax_lse=True)),
        "8 x 2048 full": lambda: flash_attn_varlen_func(q, k, v, cu8, cu8, T // 8, T // 8, out=out),
        "paged decode B=128 8K": lambda: flash_attn_with_kvcache(qd, kc, kc, cache_seqlens=lens, page_table=table),
    }
    variants = {f"{rows} rows {'split' if split else 'masked'}": {"rows": rows, "split_loop": split}
                for rows in (64, 128) for split in (False, True)}
    def snapshot(res):  # the calls write into one `out`: keep a copy of the default tiling's result
        return tuple(t.clone() for t in res) if isinstance(res, tuple) else res.clone()

    ref = {name: snapshot(fn()) for name, fn in cases.items()}
    for name, fn in cases.items():
        fns = {}
        for label, variant in variants.items():
            def run(variant=variant, fn=fn):
                with mock.patch.dict(attention.PREFILL_VARIANT, variant):
                    return fn()
            got = run()
            a, b = (got[0], ref[name][0]) if isinstance(got, tuple) else (got, ref[name])
            assert torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2), (name, label)
            fns[label] = run
        times = time_interleaved(fns, iters=10)
        shown = (f"{t:9.1f} us" if isinstance(t, float) else f"failed: {t}"[:60] for t in times.values())
        print(f"{name:24} " + "  ".join(f"{label} {t}" for label, t in zip(times, shown)), flush=True)


if __name__ == "__main__":
    main()
