"""Probe: the split combine of the sparse MLA decode, before and after session 13.

The combine took 4.2-5.7 us alone (B=1..128, session 12-13), about a fifth of a small-batch
decode (B=1 H=128: 27 us against FlashMLA's 18) and 7% of the B=128 q1 H=16 bar shape. The
session-12 kernel loops over the splits at run time and masks each partial-output load by
its split's weight, so every load waits for an LSE load; the new one unrolls the splits (a
constexpr count), loads the LSEs as one tile and splits the 512 value columns across
programs. Timed interleaved: the default decode with each combine, each combine alone,
FlashMLA. Both combines are checked against each other first.

    python benchmarks/probe_sparse_mla_combine.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from unittest import mock

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sparse_mla as bm  # noqa: E402

from mate._core.triton_helpers import to_bf16  # noqa: E402
from mate.ops.sparse_mla import decode  # noqa: E402
from mate.ops.sparse_mla.metadata import HEAD_DIM_V, plan_decode  # noqa: E402


@triton.jit
def _combine_before_kernel(
    po_ptr,
    plse_ptr,
    out_ptr,
    lse_ptr,
    out_scale,
    H,
    num_splits,
    BLOCK_HC: tl.constexpr,
    D_V: tl.constexpr,
):
    """The session-12 combine: a runtime split loop whose output loads wait on each LSE."""
    pid_h = tl.program_id(0)
    bt = tl.program_id(1).to(tl.int64)
    offs_h = pid_h * BLOCK_HC + tl.arange(0, BLOCK_HC)
    h_mask = offs_h < H
    offs_v = tl.arange(0, D_V)

    m = tl.full([BLOCK_HC], float("-inf"), tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(plse_ptr + (bt * num_splits + s) * H + offs_h, mask=h_mask, other=float("-inf")))
    m_use = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_HC], tl.float32)
    acc = tl.zeros([BLOCK_HC, D_V], tl.float32)
    for s in range(num_splits):
        rows = (bt * num_splits + s) * H + offs_h.to(tl.int64)
        lse_s = tl.load(plse_ptr + rows, mask=h_mask, other=float("-inf"))
        w = tl.exp(lse_s - m_use)  # 0 for an empty split
        o_s = tl.load(po_ptr + rows[:, None] * D_V + offs_v[None, :], mask=h_mask[:, None] & (w > 0.0)[:, None],
                      other=0.0).to(tl.float32)
        total += w
        acc += w[:, None] * o_s
    empty = total == 0.0
    t_safe = tl.where(empty, 1.0, total)
    o = acc / t_safe[:, None] * out_scale
    lse = tl.where(empty, float("inf"), m_use + tl.log(t_safe))
    o_rows = (bt * H + offs_h.to(tl.int64))[:, None] * D_V
    tl.store(out_ptr + o_rows + offs_v[None, :], to_bf16(o), mask=h_mask[:, None])
    tl.store(lse_ptr + bt * H + offs_h, lse, mask=h_mask)


def _launch_before(partial_o: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   bmm2_scale: float, H: int, num_splits: int, rows: int) -> None:
    block_hc = min(16, triton.next_power_of_2(H))
    _combine_before_kernel[(triton.cdiv(H, block_hc), rows)](
        partial_o,
        partial_lse,
        out,
        lse,
        bmm2_scale,
        H,
        num_splits,
        BLOCK_HC=block_hc,
        D_V=HEAD_DIM_V,
        num_warps=4,
    )



def _with_combine(call, launcher):
    return mock.patch.object(decode, "launch_combine", launcher)(call)


def _shape(B: int, q_len: int, H: int) -> str:
    kv = bm._cache(B)
    tokens = kv.shape[0] * bm.PAGE
    sets = bm._sets(B, q_len, H, tokens)
    scale = 1 / math.sqrt(576)
    md = plan_decode(B, q_len, H, bm.TOP_K, "cuda")
    rows = B * q_len
    if md.num_splits == 1:
        return f"B={B} q{q_len} H={H}: no split in the default plan"
    lse = torch.empty(rows, H, device="cuda")
    outs = [torch.empty(rows, H, HEAD_DIM_V, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    sets[0]["out"].fill_(float("nan"))
    bm._mate_fn(sets[0], kv, scale, md)()  # fills the partials
    decode.launch_combine(md.partial_o, md.partial_lse, outs[0], lse, 1.0, H, md.num_splits, rows)
    _launch_before(md.partial_o, md.partial_lse, outs[1], lse, 1.0, H, md.num_splits, rows)
    diff = (outs[0].float() - outs[1].float()).abs().max().item()
    bound = 2 ** -7 * outs[1].float().abs().max().item()  # the split weights are summed in another order
    assert diff <= bound, f"combines differ by {diff} (bound {bound})"
    cases = {
        f"decode ({md.num_splits} splits, gluon={md.gluon}), new combine": [bm._mate_fn(s, kv, scale, md)
                                                                             for s in sets],
        "decode, old combine": [_with_combine(bm._mate_fn(s, kv, scale, md), _launch_before) for s in sets],
        "new combine alone": [lambda: decode.launch_combine(md.partial_o, md.partial_lse, outs[0], lse, 1.0, H,
                                                            md.num_splits, rows)],
        "old combine alone": [lambda: _launch_before(md.partial_o, md.partial_lse, outs[1], lse, 1.0, H,
                                                     md.num_splits, rows)],
    }
    return bm.probe_line(f"B={B} q{q_len} H={H}", cases, sets, kv, B, H, scale)


def main() -> None:
    for B, q_len, H in ((128, 1, 16), (32, 2, 16), (1, 1, 128), (8, 1, 128), (8, 2, 128), (32, 1, 128)):
        print(_shape(B, q_len, H), flush=True)


if __name__ == "__main__":
    main()
