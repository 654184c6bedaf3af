"""Probe (session 26): the MSA decode's start, ``FAST_START`` against the plain kernel.

    python benchmarks/probe_msa_decode_start.py     # H200: interleaved A/B, layer loop and one call

Why: a %globaltimer timeline of one launch (session 23) has every program building its block
list for ~2 us before its first TMA load, with DRAM idle meanwhile: in the plain kernel the
list waits on three dependent global round trips before its page lookups (``qo_indptr[B]``,
then the ids masked by it, then the page table rows). ``FAST_START`` loads the ids beside
``qo_indptr[B]`` and prefetches the request's page-table row into L1 while they load. The fp8
bar is ~1 us from 90% of copy as a layer loop on the token-major cache.

Cases as ``probe_msa_decode_pdl.py`` (fp8 token- and head-major, bf16 token-major, the bar
inputs of ``bench_msa_attention``; 1 call and 8 calls per graph replay); outputs checked bit
for bit against the plain launch.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from probe_msa_decode_pdl import _Launch, run_layout  # noqa: E402

from mate.ops.msa import sparse_decode as sd  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per layout")
    args = ap.parse_args()

    import torch

    from mate.testing.bench import time_fn

    plain = sd.msa_decode_t_kernel
    launches = {"": _Launch(plain), " fast": _Launch(plain, FAST_START=True)}
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), iters=20, use_graph=False)
    copy = 2 * (1 << 30) / (t * 1e-6) / 1e9
    src = dst = None
    print(f"copy 1 GiB (events, measure_ceilings): {copy:.0f} GB/s", flush=True)
    for _ in range(args.rounds):
        for dtype, layout in ((torch.float8_e4m3fn, "NHD"), (torch.float8_e4m3fn, "HND"), (torch.bfloat16, "NHD")):
            run_layout(dtype, layout, launches, plain, copy, args.iters)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
