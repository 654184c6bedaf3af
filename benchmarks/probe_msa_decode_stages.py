"""Probe: load-pipeline depth of the MSA decode at small and mid batch sizes.

    python benchmarks/probe_msa_decode_stages.py [--batches 1,4,16,48,128] [--splits 1,2,4,8]

``bench_msa_attention``'s decode inputs (64K context, M3 geometry, 16 selected blocks,
token-major cache), bf16 and e4m3. Below ~128 requests the decode's programs do not fill the
GPU's program slots, and each one streams its tiles with the two or so TMA loads the pipeliner
keeps in flight: it runs at its own latency chain, not at DRAM's rate. This times the
transposed kernel with more pipelining stages (``DECODE_VARIANT["stages"]`` /
``["fp8_stages"]``; more shared memory, so fewer programs per SM) at each split count and at
the automatic one, as interleaved CUDA-graph replays of 8 calls (us per call, % of copy on the
selected K/V bytes). Outputs are checked against the default configuration's first.

H200, session 33 (raw output in ``benchmarks/results/2026-12-01-h200-s33-probes.txt``, call 2; copy
4235 GB/s): no depth beats the default 3 stages at any batch size (best split count each; fp8
3 / 4 / 6 / 8 stages: B=1 9.4 / 9.4 / 9.7 / 10.2 us, B=16 14.3 / 14.7 / 15.0 / 19.9, B=48 34.1 /
33.9 / 34.8 / 58.5, B=128 70.5 / 83.7 / 78.6 / 118.4; bf16 3 / 4 / 6: B=16 23.8 / 23.7 / 24.3,
B=128 127.4 / 134.7 / 136.3).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from mate.ops.msa import sparse_decode as sd
from mate.ops.msa.sparse_attention import resolve_num_splits, sparse_attention
from mate.ops.msa.workspace import MsaWorkspace
from mate.testing.bench import bandwidth_lines, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_msa_attention import BLK, HKV, HQ, D, decode_inputs  # noqa: E402
from bench_msa_fp8_decode_variants import copy_gbps  # noqa: E402

SEL = 16
STAGES = {torch.bfloat16: (3, 4, 6), torch.float8_e4m3fn: (3, 4, 6, 8)}


def _call(pb: dict, splits: int, over: dict, outs: dict, key: str):
    """One decode call with ``splits`` splits and ``over`` applied to ``DECODE_VARIANT`` while it
    launches, into new buffers (kept in ``outs[key]``)."""
    out = torch.empty(*pb["q"].shape, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(*pb["q"].shape[:2], device="cuda")
    outs[key] = (out, lse)
    ws = MsaWorkspace()

    def fn():
        keep = dict(sd.DECODE_VARIANT)
        sd.DECODE_VARIANT.update(over)
        try:
            sparse_attention(**pb, out=out, lse=lse, causal=True, decode=True, num_kv_splits=splits,
                             num_kv_heads=HKV, workspace=ws)
        finally:
            sd.DECODE_VARIANT.clear()
            sd.DECODE_VARIANT.update(keep)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,48,128")
    ap.add_argument("--splits", default="1,2,4,8")
    ap.add_argument("--ctx", type=int, default=65536)
    args = ap.parse_args()
    copy = copy_gbps()
    print(f"copy {copy:.0f} GB/s; {args.ctx // 1024}K context, Hq={HQ} Hkv={HKV}, {SEL} blocks; "
          "us per call (8 per replay), % of copy on the selected bytes")
    for dtype, stage_set in STAGES.items():
        pre = "fp8_" if dtype == torch.float8_e4m3fn else ""
        for B in (int(b) for b in args.batches.split(",")):
            pb = decode_inputs(B, args.ctx, dtype, SEL)
            nbytes = 2.0 * B * HKV * SEL * BLK * D * pb["k"].element_size()
            outs, cases = {}, {}
            for stages in stage_set:
                over = {pre + "stages": stages}
                keep = dict(sd.DECODE_VARIANT)
                sd.DECODE_VARIANT.update(over)
                auto = resolve_num_splits(-1, B, HQ, HKV, SEL, True, pb["q"].device, bool(pre))
                sd.DECODE_VARIANT.clear()
                sd.DECODE_VARIANT.update(keep)
                for s in [int(x) for x in args.splits.split(",")] + [-1]:
                    key = f"{stages} stages, splits {f'auto ({auto})' if s < 0 else s}"
                    fn = _call(pb, s, over, outs, key)
                    for o in outs[key]:
                        o.fill_(float("nan"))
                    try:
                        fn()
                    except Exception as exc:  # e.g. shared memory
                        print(f"  {key}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    cases[key] = [fn] * 8
            torch.cuda.synchronize()
            base = next(iter(outs.values()))
            bad = [k for k, (o, l_) in outs.items() if k in cases
                   and not ((o.float() - base[0].float()).abs().max() <= 0.02 and (l_ - base[1]).abs().max() <= 1e-3)]
            times = time_interleaved(cases, rounds=5, iters=50)
            name = "bf16" if not pre else "fp8"
            verdict = "all within 0.02 / 1e-3 of the first" if not bad else f"DIFFER: {bad}"
            print(f"--- {name} B={B}: outputs {verdict}")
            for line in bandwidth_lines(times, nbytes, copy, width=28):
                print("  " + line)
            del pb
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
