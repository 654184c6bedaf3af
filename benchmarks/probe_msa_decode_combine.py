"""Probe: the split decode's combine inside the launch against the separate combine kernel.

    python benchmarks/probe_msa_decode_combine.py [--batches 1,4,16,48,128] [--splits 1,2,4,8,16]

``bench_msa_attention``'s decode inputs (64K context, M3 geometry, 16 selected blocks,
token-major cache) at several batch sizes, bf16 and e4m3: for each split count the decode with
``DECODE_VARIANT["fused_combine"]`` on (the last program of each token and KV head merges the
partials) and off (a second kernel merges them), and the automatic split count both ways. The
two outputs are compared bit for bit first; times are interleaved CUDA-graph replays of 8
calls (a layer loop), us per call, with the copy-bandwidth fraction of the selected K/V bytes.
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


def _call(pb: dict, splits: int, fused: bool, outs: dict, key: str):
    """One decode call with ``splits`` splits and the combine fused or not, into new buffers
    (kept in ``outs[key]``)."""
    out = torch.empty(*pb["q"].shape, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(*pb["q"].shape[:2], device="cuda")
    outs[key] = (out, lse)
    ws = MsaWorkspace()  # scratch and zeroed counters allocated once, as a plan's

    def fn():
        keep = sd.DECODE_VARIANT["fused_combine"]
        sd.DECODE_VARIANT["fused_combine"] = fused
        try:
            sparse_attention(**pb, out=out, lse=lse, causal=True, decode=True, num_kv_splits=splits,
                             num_kv_heads=HKV, workspace=ws)
        finally:
            sd.DECODE_VARIANT["fused_combine"] = keep
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,48,128")
    ap.add_argument("--splits", default="1,2,4,8,16")
    ap.add_argument("--ctx", type=int, default=65536)
    args = ap.parse_args()
    copy = copy_gbps()
    print(f"copy {copy:.0f} GB/s; {args.ctx // 1024}K context, Hq={HQ} Hkv={HKV}, {SEL} blocks; "
          "us per call (8 per replay), % of copy on the selected bytes")
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        for B in (int(b) for b in args.batches.split(",")):
            pb = decode_inputs(B, args.ctx, dtype, SEL)
            nbytes = 2.0 * B * HKV * SEL * BLK * D * pb["k"].element_size()
            auto = resolve_num_splits(-1, B, HQ, HKV, SEL, True, pb["q"].device, dtype == torch.float8_e4m3fn)
            outs = {}
            cases = {}
            for s in [int(x) for x in args.splits.split(",")] + [-1]:
                label = f"auto ({auto})" if s < 0 else str(s)
                for fused in ((False, True) if s != 1 else (True,)):
                    key = f"splits {label}, {'fused' if fused else 'kernel'}"
                    fn = _call(pb, s, fused, outs, key)
                    for o in outs[key]:
                        o.fill_(float("nan"))
                    fn()
                    cases[key] = [fn] * 8
            torch.cuda.synchronize()
            base = outs["splits 1, fused"]
            same = []
            for s in [x for x in args.splits.split(",") if x != "1"] + [f"auto ({auto})"]:
                a, b = outs[f"splits {s}, kernel"], outs[f"splits {s}, fused"]
                same.append(f"{s}: {'equal' if torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) else 'DIFFER'}")
                err = (b[0].float() - base[0].float()).abs().max().item()
                same[-1] += f" (max |o - unsplit| {err:.1e})"
            times = time_interleaved(cases, rounds=5, iters=50)
            name = "bf16" if dtype == torch.bfloat16 else "fp8"
            print(f"--- {name} B={B}: fused vs kernel outputs: {'; '.join(same)}")
            for line in bandwidth_lines(times, nbytes, copy, width=28):
                print("  " + line)
            del pb
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
