"""A MiniMax-M3-shaped MSA attention layer: max-score -> top-k -> sparse prefill, then decode.

64 query heads, 4 KV heads, head_dim 128, paged bf16 KV cache with 128-token pages,
top-k 16 blocks per token and KV head with the token's own (last visible) block forced.
Each step is checked against dense attention restricted to the chosen blocks (the
PyTorch reference). Runs on a GPU, or on the CPU through the references (small sizes):

    python examples/msa_sparse_attention.py [--context 4096] [--decode-steps 4]
"""

from __future__ import annotations

import argparse

import torch

from mate.msa_interface import _msa_plan_from_lengths, msa, sparse_topk_select
from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.testing import rel_error

HQ, HKV, D, BLOCK, TOPK = 64, 4, 128, 128, 16


def structured(n: int, heads: int, sigma: float, basis: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Slowly varying rank-8 signal + noise: neighbouring tokens pick similar blocks."""
    t = torch.arange(start, start + n, dtype=torch.float32, device=basis.device)
    coef = torch.stack([torch.sin(t / (300.0 * (j + 1)) + j) for j in range(basis.shape[0])], -1)
    return (coef @ basis)[:, None, :] + sigma * torch.randn(n, heads, D, device=basis.device)


def select(q_index: torch.Tensor, k: torch.Tensor, q_lens: list[int], kv_lens: list[int], table: torch.Tensor):
    """Max-score pass over the paged cache (a dense-paged plan with max-score output), then top-k."""
    dev = q_index.device
    plan = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), HKV, num_kv_heads=HKV,
                                  page_size=BLOCK, output_maxscore=True, split_prefill_decode=False, device=dev)
    tiles = -(-max(kv_lens) // BLOCK)
    max_score = torch.empty(q_index.shape[0], HKV, tiles, dtype=torch.float32, device=dev)
    msa(q_index, k, None, plan, max_score=max_score, output_o=False, page_table=table)
    pos = torch.cat([torch.arange(kl - ql, kl) for ql, kl in zip(q_lens, kv_lens)]).to(dev)
    return sparse_topk_select(max_score, TOPK, force_end_blocks=1, query_positions=pos)


def attend(q, k, v, idx, q_lens, kv_lens, table):
    dev = q.device
    plan = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), HQ, num_kv_heads=HKV,
                                  page_size=BLOCK, kv_block_num=TOPK, force_end_blocks=1, device=dev)
    lse = torch.empty(q.shape[0], HQ, dtype=torch.float32, device=dev)
    out, _ = msa(q, k, v, plan, kv_block_indexes=idx, page_table=table, lse=lse)
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    ref, _ = sparse_attention_reference(q, k, v, idx, qo, torch.tensor(kv_lens, dtype=torch.int32, device=dev),
                                        page_table=table, num_kv_heads=HKV)
    return out, rel_error(out, ref), plan.plan.mode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=None, help="prompt length (default 4096 GPU, 640 CPU)")
    ap.add_argument("--decode-steps", type=int, default=3)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = args.context or (4096 if dev == "cuda" else 640)
    steps = args.decode_steps
    torch.manual_seed(0)
    capacity = ctx + steps
    pages = -(-capacity // BLOCK)
    table = torch.randperm(pages + 3, device=dev)[:pages].to(torch.int32)[None].contiguous()  # shuffled pages
    k_cache = torch.zeros(pages + 3, BLOCK, HKV, D, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn(pages + 3, BLOCK, HKV, D, device=dev).to(torch.bfloat16)
    basis = torch.randn(8, D, device=dev)

    def write_keys(keys: torch.Tensor, start: int) -> None:
        for i in range(keys.shape[0]):
            p = start + i
            k_cache[table[0, p // BLOCK], p % BLOCK] = keys[i]

    # prefill: the whole prompt attends to its own selected blocks
    keys = structured(ctx, HKV, 0.5, basis).to(torch.bfloat16)
    write_keys(keys, 0)
    q_idx = structured(ctx, HKV, 0.5, basis).to(torch.bfloat16)  # one proxy (index) head per KV head
    idx = select(q_idx, k_cache, [ctx], [ctx], table)
    q = (q_idx.repeat_interleave(HQ // HKV, 1).float() * D ** -0.25).to(torch.bfloat16)
    out, err, mode = attend(q, k_cache, v_cache, idx, [ctx], [ctx], table)
    print(f"prefill {ctx} tokens ({mode}): out {tuple(out.shape)}, relative error vs reference {err:.2e}")
    assert err < 1e-2

    # decode: one new token per step, appended to the cache, then the same pipeline
    for s in range(steps):
        n = ctx + s + 1
        new_key = structured(1, HKV, 0.5, basis, start=n - 1).to(torch.bfloat16)
        write_keys(new_key, n - 1)
        q_idx = structured(1, HKV, 0.5, basis, start=n - 1).to(torch.bfloat16)
        idx = select(q_idx, k_cache, [1], [n], table)
        q = (q_idx.repeat_interleave(HQ // HKV, 1).float() * D ** -0.25).to(torch.bfloat16)
        out, err, mode = attend(q, k_cache, v_cache, idx, [1], [n], table)
        chosen = sorted(set(idx[0, 0].tolist()) - {-1})
        print(f"decode step {s}: context {n} ({mode}), blocks of KV head 0 {chosen}, relative error {err:.2e}")
        assert err < 1e-2
    print("ok")


if __name__ == "__main__":
    main()
