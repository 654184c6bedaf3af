"""Probe: how fast can *any* read schedule fetch the MSA fp8 decode's selected K/V bytes?

``probe_msa_decode_floor.py`` measured the decode kernel's own load schedule (its grid, block
list and TMA pipeline with the compute taken out) at 88-90% of copy on the token-major cache,
where one KV head's key row is a 128-byte piece at a 512-byte stride. This asks whether that
is the decode's schedule or the memory system: plain vectorized loads of exactly the selected
K and V rows (the bar's inputs, ``bench_msa_attention.decode_inputs``: B = 128, 64K context,
4 KV heads, 16 blocks of 128 keys), XOR-reduced so nothing is dead code, under several
schedules:

- ``per head``: one program per (token, KV head) walking its 16 blocks (the decode's grid);
- ``per block``: one program per (token, KV head, block): 8,192 programs that the hardware
  schedules as SMs free up (no static one-wave partition);
- ``per block, heads adjacent``: the same, with the 4 KV heads of a (token, block slot)
  numbered next to each other;
- each also on a head-major copy of the cache (a block's K and V rows of a head are 16 KB
  contiguous each), and the decode itself on the token-major cache as the anchor.
- ``TMA ...``: the same bytes as TMA boxes through the pipeliner
  (``bench_msa_attention.selected_read_kernel``, whose per-head form is that benchmark's
  read-floor row) per head (the decode's grid), per 4 / 2 / 1 blocks, and per block with 2
  stages.

H200, session 31 (two processes, copy 4261 GB/s; % of copy): token-major plain loads 86.6-92.0%
(per block 91.3-91.9, heads adjacent 91.4-92.0), TMA 90.6-91.7% (per head 90.8-91.0, per block
91.3-91.4, 2 stages 91.7); head-major 89.1-97.5% (TMA per head 95.2-95.6, per block 96.2-96.3);
the decode 81.9-82.9% in the same processes. No schedule of the token-major bytes passes 92%
on that machine, and the hardware-balanced ones gain under 1% over the decode's own grid.

    python benchmarks/probe_msa_read_floor.py
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

from mate.ops.msa.sparse_attention import sparse_attention
from mate.testing.bench import time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_msa_attention import BLK, HKV, HQ, D, decode_inputs, read_floor_call  # noqa: E402
from bench_msa_fp8_decode_variants import copy_gbps  # noqa: E402

SEL = 16


@triton.jit
def read_kernel(k_ptr, v_ptr, pg_ptr, sink_ptr, n_units, HKV: tl.constexpr, SEL: tl.constexpr, BLK: tl.constexpr,
                ROW: tl.constexpr, KEYS: tl.constexpr, PER_PROG: tl.constexpr, HEADS_FAST: tl.constexpr,
                HEAD_MAJOR: tl.constexpr):
    """Reads the K and V rows (``ROW`` int32 words per key and head) of ``PER_PROG``
    consecutive selected blocks of one (token, KV head); XORs them into one stored word."""
    p = tl.program_id(0)
    per_tok = SEL // PER_PROG
    if HEADS_FAST:  # p = (t * per_tok + slot) * HKV + h
        h = p % HKV
        slot = (p // HKV) % per_tok
        t = p // (HKV * per_tok)
    else:  # p = (t * HKV + h) * per_tok + slot
        slot = p % per_tok
        h = (p // per_tok) % HKV
        t = p // (per_tok * HKV)
    keys = tl.arange(0, KEYS)[:, None]
    cols = tl.arange(0, ROW)[None, :]
    acc = tl.zeros([KEYS, ROW], dtype=tl.int32)
    for j in range(PER_PROG):
        page = tl.load(pg_ptr + (t * HKV + h) * SEL + slot * PER_PROG + j).to(tl.int64)
        for k0 in range(0, BLK, KEYS):
            if HEAD_MAJOR:
                row = (page * HKV + h) * BLK + k0 + keys
            else:
                row = (page * BLK + k0 + keys) * HKV + h
            acc ^= tl.load(k_ptr + row * ROW + cols)
            acc ^= tl.load(v_ptr + row * ROW + cols)
    tl.store(sink_ptr + p, tl.reduce(tl.reshape(acc, [KEYS * ROW]), 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def main() -> None:
    copy = copy_gbps()
    pb = decode_inputs(128, 65536, torch.float8_e4m3fn, SEL)
    k, v, idx, table = pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    B = table.shape[0]
    pg = torch.gather(table, 1, idx.view(B, -1).long()).view(B, HKV, SEL).to(torch.int32).contiguous()
    row = D * k.element_size() // 4
    k32, v32 = k.view(torch.int32), v.view(torch.int32)  # [pages, BLK, HKV, row]
    k_hnd, v_hnd = (x.permute(0, 2, 1, 3).contiguous() for x in (k32, v32))  # [pages, HKV, BLK, row]
    nbytes = 2.0 * B * HKV * SEL * BLK * D * k.element_size()
    sink = torch.empty(B * HKV * SEL, dtype=torch.int32, device="cuda")
    out = torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, HQ, device="cuda")

    def reader(per_prog, heads_fast, head_major, keys=64, warps=4):
        kk, vv = (k_hnd, v_hnd) if head_major else (k32, v32)
        n = B * HKV * (SEL // per_prog)

        def fn():
            read_kernel[(n,)](kk, vv, pg, sink, n, HKV, SEL, BLK, row, keys, per_prog, heads_fast, head_major,
                              num_warps=warps)
        return fn

    def tma_reader(per_prog, head_major, keys=64, warps=4, stages=3):
        kk, vv = (k_hnd, v_hnd) if head_major else (k32, v32)
        return read_floor_call(kk.view(k.dtype), vv.view(k.dtype), pg, head_major, per_prog=per_prog, keys=keys,
                               warps=warps, stages=stages)

    def decode():
        sparse_attention(pb["q"], k, v, kv_block_indexes=idx, page_table=table, qo_indptr=pb["qo_indptr"],
                         kv_lens=pb["kv_lens"], out=out, lse=lse, causal=True, decode=True, num_kv_splits=-1,
                         num_kv_heads=HKV)

    cases = {"decode (token-major, default)": decode}
    for hm, lay in ((False, "NHD"), (True, "HND")):
        cases[f"{lay} per head (512 programs)"] = reader(SEL, False, hm)
        cases[f"{lay} per head, 128-key loads, 8 warps"] = reader(SEL, False, hm, keys=128, warps=8)
        cases[f"{lay} per 4 blocks (2048 programs)"] = reader(4, False, hm)
        cases[f"{lay} per block (8192 programs)"] = reader(1, False, hm)
        cases[f"{lay} per block, heads adjacent"] = reader(1, True, hm)
        cases[f"{lay} per block, 128-key loads, 8 warps"] = reader(1, False, hm, keys=128, warps=8)
        cases[f"{lay} TMA per head (512 programs)"] = tma_reader(SEL, hm)
        cases[f"{lay} TMA per 4 blocks (2048 programs)"] = tma_reader(4, hm)
        cases[f"{lay} TMA per 2 blocks (4096 programs)"] = tma_reader(2, hm)
        cases[f"{lay} TMA per block (8192 programs)"] = tma_reader(1, hm)
        cases[f"{lay} TMA per block, 2 stages"] = tma_reader(1, hm, stages=2)
    # every schedule XORs the same words: one check that all read the same bytes
    ref = None
    for name, fn in cases.items():
        if name.startswith("decode") or " TMA " in name:
            continue
        sink.zero_()
        fn()
        acc = 0
        for x in sink.tolist():
            acc ^= x
        ref = acc if ref is None else ref
        print(f"  {name}: xor of all words {acc:#x}{'' if acc == ref else '  MISMATCH'}", flush=True)
    times = time_interleaved(cases, rounds=5, iters=50)
    bar_us = nbytes / (0.9 * copy * 1e3)
    print(f"--- fp8 selected K/V {nbytes / 1e6:.1f} MB; copy {copy:.0f} GB/s; 90% bar {bar_us:.1f} us")
    for name, t in times.items():
        if isinstance(t, float):
            gbps = nbytes / (t * 1e-6) / 1e9
            print(f"{name:44s} {t:8.1f} us {gbps:8.0f} GB/s {100 * gbps / copy:6.1f}% of copy")
        else:
            print(f"{name:44s} {t}")


if __name__ == "__main__":
    main()
