"""Probe: MSA sparse prefill with e4m3 q / K / V against bf16, at the prefill bar's shape.

    python benchmarks/probe_msa_prefill_fp8.py [--tokens 32768]

``bench_msa_attention``'s prefill inputs (one request of ``--tokens`` tokens, M3 geometry,
paged cache in shuffled pages, sigma-0.5 selections from mate's max-score pass and top-k):
the same call with the cache and q in bf16 and in e4m3 (``k_scale`` / ``v_scale`` 1), timed
interleaved (CUDA-graph replays), each checked against the bf16 call's output (e4m3
rounding: a few percent), and e4m3 variants of the prefill tiles (``FP8_VARIANT``'s
``prefill_keys`` / ``prefill_stages``).

H200, session 30 (raw output in ``benchmarks/results/2026-12-01-h200-s30-probes.txt``, us at 32K /
8K): bf16 4641-4655 / 1021-1029; e4m3 with one TMA stage (the default until then) 6135-6476 /
1337-1343; 128 keys with 2 stages 5324-5468 / 1166-1168 (bit-identical; now the default), 3
stages 5576 / 1191; 64 keys (3 programs per SM) with 1 / 2 / 3 stages 5989 / 5415-5418 /
5591-5630. e4m3 against bf16: max |out| difference 0.125, |lse| 0.047 (the inputs' rounding).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from mate.ops.msa import sparse_attention as sa
from mate.ops.msa.sparse_attention import sparse_attention
from mate.testing.bench import time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_msa_attention import BLK, HKV, HQ, TOPK, D, _select_mate, _structured  # noqa: E402

VARIANTS = {  # FP8_VARIANT updates
    "fp8 keys 64": {"prefill_keys": 64},
    "fp8 keys 64, 2 stages": {"prefill_keys": 64, "prefill_stages": 2},
    "fp8 keys 64, 3 stages": {"prefill_keys": 64, "prefill_stages": 3},
    "fp8 keys 128, 1 stage": {"prefill_stages": 1},
    "fp8 keys 128, 2 stages": {"prefill_stages": 2},
    "fp8 keys 128, 3 stages": {"prefill_stages": 3},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    T = ap.parse_args().tokens
    g = torch.Generator(device="cuda").manual_seed(0)
    nb = -(-T // BLK)
    table = torch.randperm(nb + 7, device="cuda", generator=g).to(torch.int32)[:nb][None].contiguous()
    k = torch.randn(nb + 7, BLK, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    qo = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    kvl = torch.tensor([T], dtype=torch.int32, device="cuda")
    qi, ki = _structured(T, 0.5, g, HKV)
    idx = _select_mate(qi, ki, TOPK)
    q = ((qi.repeat_interleave(HQ // HKV, 1) + 0.1 * torch.randn(T, HQ, D, device="cuda", generator=g))
         * D ** -0.25).to(torch.bfloat16)
    inputs = {"bf16": (q, k, v), "fp8": tuple(x.to(torch.float8_e4m3fn) for x in (q, k, v))}
    outs = {name: torch.empty(T, HQ, D, device="cuda", dtype=torch.bfloat16) for name in inputs}
    lses = {name: torch.empty(T, HQ, device="cuda") for name in inputs}

    def call(name):
        def run():
            qq, kk, vv = inputs[name]
            sparse_attention(qq, kk, vv, kv_block_indexes=idx, page_table=table, qo_indptr=qo, kv_lens=kvl,
                             out=outs[name], lse=lses[name], causal=True, decode=False, num_kv_heads=HKV)
        return run

    def variant(updates):
        def run():
            keep = dict(sa.FP8_VARIANT)
            sa.FP8_VARIANT.update(updates)
            try:
                call("fp8")()
            finally:
                sa.FP8_VARIANT.clear()
                sa.FP8_VARIANT.update(keep)
        return run

    cases = {name: call(name) for name in inputs}
    cases.update({name: variant(upd) for name, upd in VARIANTS.items()})
    for fn in cases.values():
        fn()
    torch.cuda.synchronize()
    print(f"--- sparse prefill T={T} Hq={HQ} Hkv={HKV} d={D} top{TOPK} (sigma 0.5), fp8 against bf16:")
    ref = outs["fp8"].clone(), lses["fp8"].clone()
    for name, fn in cases.items():  # each fp8 variant against the default fp8 call (bit-identical) and bf16
        if name == "bf16":
            continue
        fn()
        torch.cuda.synchronize()
        same = torch.equal(outs["fp8"], ref[0]) and torch.equal(lses["fp8"], ref[1])
        err = (outs["fp8"].float() - outs["bf16"].float()).abs().max().item()
        lse_err = (lses["fp8"] - lses["bf16"]).abs().max().item()
        print(f"  {name}: max |out| diff {err:.3g}, max |lse| diff {lse_err:.3g}, same as fp8: {same}")
    times = time_interleaved(cases, iters=10)
    for name, t in times.items():
        print(f"{name:22s} {t:9.1f} us" if isinstance(t, float) else f"{name:22s} {t}")


if __name__ == "__main__":
    main()
