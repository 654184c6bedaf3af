"""Probe (session 23): does the gathered rows' address footprint set the small-H sparse MLA time?

    python benchmarks/probe_sparse_mla_footprint.py   # H200

B=128 q1 H=16 top-k 2048 (the issue-3 bar) with the same kernel and plan, interleaved, on:
``uniform 604 MB`` (``bench_sparse_mla``'s inputs: every request's 2048 rows drawn from one
1M-token cache), ``uniform 302 MB`` (half the cache, as the B=64 rows of that benchmark use),
``per-request`` (the 604 MB cache, request b's rows drawn from its own 8192 tokens, pages in
order: a fresh engine's pool) and ``per-request shuffled`` (the same tokens, the request's 128
pages of 64 tokens scattered over the whole cache: a fragmented pool). Session 22 saw B=64 q2
(same gathered bytes and programs, the 302 MB cache) at 75.7% of copy against 73.7% here.

H200 (session 23, call 1, copy 4261 GB/s; us, each case twice): uniform 604 MB 49.6 / 49.3
(73.1-73.4%), uniform 302 MB 47.8 / 47.8 (75.8%), per-request 50.3 / 50.3 (71.9%), per-request
shuffled 50.6 / 50.6 (71.6%). The smaller cache is faster because more of the gathered rows are
still in the L2 (60 MB) from earlier calls (up to 1 in 5 instead of 1 in 10), not because of address
translation: a request's rows confined to 4.7 MB (3 large pages) are slower, not faster. The bar's
inputs (604 MB, uniform) are not the pessimistic case; rows local to their request cost ~2% more.
"""

from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_sparse_mla import PAGE, TOP_K, _bytes, _cache  # noqa: E402

from mate.ops.sparse_mla.metadata import plan_decode  # noqa: E402
from mate.sparse_mla_interface import sparse_mla_fp8_decode  # noqa: E402
from mate.testing.bench import measure_ceilings, rotation_count, time_interleaved  # noqa: E402

B, Q_LEN, H = 128, 1, 16
CTX = 8192  # tokens per request in _cache (B * 8192 tokens)


def _idx(kind: str, tokens: int) -> torch.Tensor:
    if kind == "uniform 604 MB":
        return torch.randint(0, tokens, (B, Q_LEN, TOP_K), device="cuda", dtype=torch.int32)
    if kind == "uniform 302 MB":
        return torch.randint(0, tokens // 2, (B, Q_LEN, TOP_K), device="cuda", dtype=torch.int32)
    local = torch.rand(B, Q_LEN, CTX, device="cuda").argsort(-1)[..., :TOP_K]  # distinct tokens of the request
    if kind == "per-request":
        return (local + torch.arange(B, device="cuda")[:, None, None] * CTX).to(torch.int32)
    pages = torch.randperm(tokens // PAGE, device="cuda").view(B, CTX // PAGE)  # the request's pages, scattered
    page = torch.gather(pages[:, None, :].expand(B, Q_LEN, -1), 2, local // PAGE)
    return (page * PAGE + local % PAGE).to(torch.int32)


def main() -> int:
    copy = measure_ceilings()["copy_GBps"]
    kv = _cache(B)
    tokens = kv.shape[0] * PAGE
    scale = 1 / math.sqrt(576)
    md = plan_decode(B, Q_LEN, H, TOP_K, "cuda")
    n = rotation_count(B * Q_LEN * TOP_K * 576)
    cases = {}
    for kind in ("uniform 604 MB", "uniform 302 MB", "per-request", "per-request shuffled"):
        fns = []
        for _ in range(n):
            q = torch.randn(B, Q_LEN, H, 576, device="cuda").to(torch.float8_e4m3fn)
            idx = _idx(kind, tokens)
            sl = torch.full((B,), TOP_K, device="cuda", dtype=torch.int32)
            out = torch.empty(B, Q_LEN, H, 512, device="cuda", dtype=torch.bfloat16)
            fns.append(lambda q=q, idx=idx, sl=sl, out=out: sparse_mla_fp8_decode(
                q, kv, None, 128, 512, 64, idx, sl, 0, TOP_K, out=out, bmm1_scale=scale, metadata=md))
        cases[kind] = fns
        cases[kind + " again"] = fns
    times = time_interleaved(cases, iters=50)
    nbytes = _bytes(B, Q_LEN, H)
    print(f"sparse MLA B={B} q{Q_LEN} H={H} top-k {TOP_K}: copy {copy:.0f} GB/s, {nbytes / 1e6:.1f} MB gathered")
    for name, t in times.items():
        print(f"  {name:28} {t:7.1f} us  {nbytes / t / 1e3 / copy:6.1%} of copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
