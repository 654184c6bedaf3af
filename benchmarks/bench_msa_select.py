"""MSA block selection on the H200: the max-score pass and sparse_topk_select.

Max-score uses MiniMax-M3's indexer geometry (one proxy query head per KV head: 4 heads,
d 128, bf16, 128-token pages, token-major, shuffled page table), for prefill (every token
of one request, causal) at 8K-128K context and decode (B requests, one token each). Its
FLOPs count the visible (causal) q.k products: 2 * d * heads * sum(visible keys); prefill
is compared with the cuBLAS bf16 rate measured in the same run, decode (a K-cache read)
with copy bandwidth. The naive peer is torch's dense matmul + causal mask + block max
where it fits in memory.

Top-k counts the bytes of scores read, against copy bandwidth; torch.topk (values only,
no forced blocks, unsorted ids) is the peer.
"""

from __future__ import annotations

import json

import torch

from mate.msa_interface import _msa_plan_from_lengths, msa, sparse_topk_select
from mate.ops.msa import maxscore as maxscore_mod
from mate.ops.msa import topk as topk_mod
from mate.testing.bench import record, time_fn

FAMILY = "msa_select"
BLK = 128
H, D = 4, 128


def _paged_k(batch: int, kv_len: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    tiles = -(-kv_len // BLK)
    pages = batch * tiles
    k = torch.randn(pages, BLK, H, D, device=device, dtype=torch.bfloat16)
    table = torch.randperm(pages, device=device, dtype=torch.int64).to(torch.int32).view(batch, tiles)
    return k, table


def _bench_prefill(ceilings: dict, ctx: int, rows: list[dict]) -> None:
    dev = "cuda"
    k, table = _paged_k(1, ctx)
    q = torch.randn(ctx, H, D, device=dev, dtype=torch.bfloat16)
    info = _msa_plan_from_lengths(torch.tensor([ctx]), torch.tensor([ctx]), H, H, page_size=BLK,
                                  output_maxscore=True, device=dev)
    ms = torch.empty(ctx, H, -(-ctx // BLK), device=dev)
    fn = lambda: msa(q, k, None, info, output_o=False, page_table=table, max_score=ms)
    flops = 2 * D * H * ctx * (ctx + 1) / 2
    shape = f"prefill S={ctx} H={H} d={D} causal"
    t = time_fn(fn, iters=10 if ctx >= 65536 else 30)
    rows.append(record(ceilings, family=FAMILY, op="max_score", shape=shape, impl="mate", time_us=t, flops=flops,
                       dtype="bf16", ceiling="cublas_bf16_TFLOPs",
                       note=f"default {maxscore_mod.PREFILL_BLOCK_M}-row tiles"))
    if ctx in (32768, 131072):  # the prefill row-tile variants side by side (module default swapped per row)
        default = maxscore_mod.PREFILL_BLOCK_M
        for bm in (128, 256):
            maxscore_mod.PREFILL_BLOCK_M = bm
            try:
                tv, note = time_fn(fn, iters=10 if ctx >= 65536 else 30), f"{bm}-row tiles"
            except Exception as exc:
                tv, note = None, f"{bm}-row tiles failed: {type(exc).__name__}: {exc}"[:300]
            finally:
                maxscore_mod.PREFILL_BLOCK_M = default
            rows.append(record(ceilings, family=FAMILY, op="max_score", shape=shape, impl=f"mate_bm{bm}", time_us=tv,
                               flops=flops, dtype="bf16", ceiling="cublas_bf16_TFLOPs", note=note))
    if ctx <= 32768:
        kd = k[table[0].long()].reshape(-1, H, D)[:ctx]
        qh, kh = q.transpose(0, 1), kd.transpose(0, 1)
        tiles = -(-ctx // BLK)
        causal = torch.ones(ctx, ctx, device=dev, dtype=torch.bool).tril_()

        def naive():
            s = torch.matmul(qh, kh.transpose(1, 2)).float().masked_fill_(~causal, float("-inf"))
            return s.view(H, ctx, tiles, BLK).amax(-1)

        try:
            tn = time_fn(naive, iters=5, use_graph=False)
            note = "dense bf16 matmul + causal mask + block max (bf16-rounded scores)"
        except Exception as exc:  # out of memory at the largest shapes
            tn, note = None, f"failed: {type(exc).__name__}"
        rows.append(record(ceilings, family=FAMILY, op="max_score", shape=shape, impl="torch_naive", time_us=tn,
                           flops=flops, dtype="bf16", ceiling="cublas_bf16_TFLOPs", note=note))
        torch.cuda.empty_cache()


def _bench_decode(ceilings: dict, batch: int, ctx: int, rows: list[dict]) -> None:
    dev = "cuda"
    k, table = _paged_k(batch, ctx)
    q = torch.randn(batch, H, D, device=dev, dtype=torch.bfloat16)
    info = _msa_plan_from_lengths(torch.ones(batch, dtype=torch.int64), torch.full((batch,), ctx), H, H,
                                  page_size=BLK, output_maxscore=True, device=dev)
    ms = torch.empty(batch, H, -(-ctx // BLK), device=dev)
    fn = lambda: msa(q, k, None, info, output_o=False, page_table=table, max_score=ms)
    t = time_fn(fn, iters=20)
    rows.append(record(ceilings, family=FAMILY, op="max_score", shape=f"decode B={batch} ctx={ctx} H={H} d={D}",
                       impl="mate", time_us=t, flops=2 * D * H * batch * ctx, nbytes=k.numel() * 2,
                       dtype="bf16", ceiling="copy_GBps", note="bytes = K cache read once"))
    torch.cuda.empty_cache()


def _bench_topk(ceilings: dict, total_q: int, tiles: int, rows: list[dict], causal_positions: bool = False) -> None:
    dev = "cuda"
    sets = max(1, min(8, (512 << 20) // (total_q * H * tiles * 4)))
    scores = [torch.randn(total_q, H, tiles, device=dev) for _ in range(sets)]
    out = torch.empty(total_q, H, 17, device=dev, dtype=torch.int32)
    qpos = None
    if causal_positions:  # a prefill: token t sees blocks 0 .. t // 128 (the end of the context)
        qpos = torch.arange(total_q, device=dev, dtype=torch.int64) + (tiles * BLK - total_q)
    fns = [lambda s=s: sparse_topk_select(s, 16, output=out, force_end_blocks=1, force_blocks_count_in_topk=False,
                                          query_positions=qpos) for s in scores]
    nbytes = total_q * H * tiles * 4
    shape = f"total_q={total_q} H={H} tiles={tiles} top16+1" + (" causal positions" if causal_positions else "")
    rows.append(record(ceilings, family=FAMILY, op="sparse_topk_select", shape=shape, impl="mate",
                       time_us=time_fn(fns, iters=50), nbytes=nbytes, dtype="fp32", ceiling="copy_GBps",
                       note=f"default threshold method: {topk_mod.TOPK_METHOD} "
                            f"({topk_mod.LANES_WARPS} one-row warps per program)"))
    # every threshold method side by side (the launcher on the same validated tensors)
    for method in topk_mod.TOPK_METHODS:
        var = [lambda s=s, m=method: topk_mod.sparse_topk_select_triton(
            s, out, query_positions=qpos, num_valid_pages=tiles, topk=16, force_begin_blocks=0, force_end_blocks=1,
            force_blocks_count_in_topk=False, method=m) for s in scores]
        try:
            tv, note = time_fn(var, iters=50), f"threshold method {method}"
        except Exception as exc:  # a variant that fails to compile or launch still leaves a row
            tv, note = None, f"threshold method {method} failed: {type(exc).__name__}: {exc}"[:300]
        rows.append(record(ceilings, family=FAMILY, op="sparse_topk_select", shape=shape, impl=f"mate_{method}",
                           time_us=tv, nbytes=nbytes, dtype="fp32", ceiling="copy_GBps", note=note))
    if not causal_positions:
        peer = [lambda s=s: torch.topk(s, 16, dim=-1) for s in scores]
        rows.append(record(ceilings, family=FAMILY, op="sparse_topk_select", shape=shape, impl="torch.topk",
                           time_us=time_fn(peer, iters=50), nbytes=nbytes, dtype="fp32", ceiling="copy_GBps",
                           note="values + indices of the top 16, no forced block, ids not sorted"))
    del scores
    torch.cuda.empty_cache()


class _Rows(list):
    """Prints each row as it is recorded, so a run cut short still reports what it measured."""

    def append(self, row: dict) -> None:
        super().append(row)
        keep = ("op", "shape", "impl", "time_us", "TFLOPs", "GBps", "frac_ceiling", "note")
        print("[bench_msa_select]", json.dumps({k: row.get(k) for k in keep if k in row}), flush=True)


def run(ceilings: dict, quick: bool = False) -> list[dict]:
    rows: list[dict] = _Rows()
    contexts = [8192, 32768, 131072] if quick else [8192, 16384, 32768, 65536, 131072]
    for ctx in contexts:
        _bench_prefill(ceilings, ctx, rows)
    batches = [64, 256] if quick else [64, 128, 256]
    for batch in batches:
        for ctx in ([32768, 131072] if quick else [8192, 32768, 131072]):
            _bench_decode(ceilings, batch, ctx, rows)
    _bench_topk(ceilings, 32768, 256, rows)
    _bench_topk(ceilings, 32768, 256, rows, causal_positions=True)
    _bench_topk(ceilings, 8192, 1024, rows)
    _bench_topk(ceilings, 1024, 12287, rows)
    return list(rows)
