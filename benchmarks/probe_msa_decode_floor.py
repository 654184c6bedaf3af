"""Where the MSA fp8 decode's time goes at the bar shape: the default kernel against the same
launch with its work taken away piece by piece, on the token-major cache and a head-major copy.

    python benchmarks/probe_msa_decode_floor.py [--sel 16] [--dtype fp8|bf16] [--set floors|hnd|configs]

Inputs: ``bench_msa_fp8_decode_variants``'s (B = 128, q_len 1, 64K, M3 geometry, NHD cache;
``hnd`` / ``configs`` add a head-major copy of it). Every case goes through
``sparse_attention`` as the benchmark calls it; the probe cases swap
``sparse_decode.msa_decode_t_kernel`` for :func:`floor_kernel` (same signature and grid, the
same in-kernel block list) while they launch:

- ``default``: the decode kernel; ``L2 data``: with every page-table entry 0, so every tile is
  read from the same page (L2 hits): the compute and latency chain without DRAM.
- ``floor``: the same TMA loads through the same pipeliner (stages, programs per SM), each tile
  consumed by two small wgmmas (K·Qᵀ and V·Qᵀ) and no softmax: how fast this load schedule
  streams the selected bytes. ``head pairs``: each tile reads K of the head pair (kvh, kvh ^ 1)
  instead of K and V of kvh: the same bytes and boxes, in aligned 256-byte pieces.
- ``loop``: the decode kernel's lazy loop (``MODE=3``), with its softmax and / or its V
  widening left out.
- ``list only``: the block list and an output store, no key loop; ``null``: returns at once.

H200, 2026-11-30 (fp8, 268 MB of selected K/V, interleaved CUDA-graph replays; each line one
call, copy 4189-4265 GB/s; % of copy; the 90% bar is 70.0 us):

- token-major (NHD): default 76.5 us (82.3%), floor 70.9 (88.9%), floor with head pairs 65.3
  (96.4%), 128-key floor 71.5, 8-warp floor 74.2; list only 4.1, null 3.1; L2 data 55.3. Other
  calls: floor 71.2 (88.4%) / 71.3 (89.9%) against default 76.6 / 76.0. The load schedule
  alone streams at 88-90% of copy: a key row of one KV head is a 128-byte piece at a 512-byte
  stride, and the same bytes fetched as 256-byte pieces stream at 96%. DRAM's access
  granularity, not the kernel, caps this layout at the 90% bar.
- head-major (HND): default 72.5 (86.9%), floor 66.5 (94.8%), L2 data 56.3; the loop without
  its softmax 69.3 (90.8%; L2 44.4), without the V widening 68.4 (92.0%; L2 34.2), without both
  67.3 (93.6%), the whole loop 72.5 (L2 57.9). A block's K and V are 16 KB contiguous each
  here, and the floor is 94-96%; the gap to it is the loop's compute (with the data in L2 the loop takes
  56-58 us of the 72.5), of which the V widening is the largest part.
- configs, HND (one call: default 73.2 / 74.1 in two copies of the case): 128-key tiles
  uncapped (247 registers, 2 programs per SM) 75.2 / 75.5; NHD 76.8, NHD 128-key 78.8. Another
  call (a slower machine state for the 64-key kernel: HND default 79.7, floor 67.2): 128-key
  3 stages 75.5, 2 stages 83.6, 64-key uncapped (3 programs per SM) 95.2. An earlier call: 2
  stages 82.9, lazy 0 79.3, 2 splits 87.8 against default 78.5.
- The Gluon port of the kernel (commit 47a84ef^, ``sparse_decode_gluon.py``: V read with 32-bit
  shared loads into a permuted register operand, ~361 instead of ~489 instructions per tile),
  restored for one call: bit-identical outputs, L2 data 48.8 us against 55.8, yet HND 74.0
  against 73.8 and NHD 76.9 against 76.0 (2 stages HND 73.1); not kept. Restored again with
  the ring slot refilled right after Sᵀ and the V loads (one CTA barrier more) instead of
  after the barrier that publishes P (``.devreq`` script, a slow machine state whose HND floor
  was 75.7 us): HND 81.4 against 80.7 (late refill) and 80.4 (Triton), NHD 84.0 against 84.5;
  outputs bit-identical to the Triton kernel's.
- bf16 (536 MB): default 132.8 (94.8%), floor 128.0 (98.4%), L2 data 62.4.

H200, session 30 (2026-12-01, three processes in two machine sessions, copy 4236-4238 GB/s; the
90% bar is 70.4 us): the token-major floor streamed at 91.8-92.6% this time (68.4-69.0 us;
head pairs 98.2%, 4 / 6 stages 89.1 / 90.5%), the head-major floor at 95.9-96.4%; the decode
73.2-73.7 us (86.0-86.6%) token-major and 71.1-71.2 (88.9-89.1%) head-major. The loop's parts
(two processes, us): whole loop HND 71.3 / 71.3 (L2 55.5 / 55.0), no softmax 70.6 / 70.5, no
widening 67.2 / 67.2 (L2 31.8), neither 66.4 / 66.4, P fixed (V still gathered and widened) 70.9
/ 70.6 (L2 53.4 / 53.2); NHD whole loop 73.5 / 73.5, NHD no widening 70.0 / 70.0 (90.6%). So
the cost over the floor is the V gather and widening of the register operand, not the P store
through shared memory, the softmax or the barriers around them; and without any widening the
token-major loop would stream at 90.6%, at the bar. ``MODE=4`` (a third call, two processes) makes
Vᵀ with an identity QGMMA instead of the byte gather (V as two [64, 64] boxes; eye · Vᵀ is exact, the
fp32 product is widened to the same fp16 operand; sm_90: 128 registers, no spills, 53.3 KB, 434
instead of 486 loop instructions, no LDS.U8): HND 69.9 / 70.6 us against the loop's 71.4 / 72.7
(L2 50.0 against 55.2), NHD 73.1 / 72.5 against 73.6 / 73.3 (the floor 68.4 / 68.5, no widening
69.7 / 69.6): 1-2% on the head-major cache and under 1% on the token-major one, which stays at
86.8-87.4% of copy. With the identity product accumulated in fp16 (``F16_ACC``, no conversion)
and issued before Sᵀ (``V_FIRST``; a fourth call, another machine, copy 4260: NHD floor 88.5%): HND
70.5 / 70.9 against the loop's 72.6 / 72.5 (L2 45.9 against 55.2), NHD 74.3 / 74.6 against 76.5 /
76.4. Taken into the kernel as ``DECODE_VARIANT["fp8_v"] = "mma"``, the whole kernel gained less
than the loop copy did (a fifth call, the kernel with either Vᵀ in one process, us, mma / gather:
NHD 75.6 / 76.5 and 76.4 / 76.7, HND 73.0 / 72.9 and 72.4 / 72.9; L2 44.5-44.7 against ~53).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

from mate.ops.msa import sparse_decode as sd
from mate.ops.msa.softmax_helpers import split_entries, visible_limit
from mate.testing.bench import bandwidth_lines, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_msa_fp8_decode_variants as bv  # noqa: E402
from bench_msa_attention import BLK, HKV, HQ, D  # noqa: E402


@triton.jit
def floor_kernel(
    q_ptr, stride_qt, stride_qh,
    k_desc, v_desc,
    u_page_ptr, u_blk_ptr, u_cnt_ptr,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh,
    op_ptr, lp_ptr,
    total_q, HQ, RATIO, qk_scale, v_scale,
    idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
    page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, W,
    GP: tl.constexpr, C: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, IS_FP8: tl.constexpr, HEAD_MAJOR: tl.constexpr, FLAT: tl.constexpr = True,
    KEYS: tl.constexpr = 128, BLOCK_W: tl.constexpr = 16, USE_PAGE_TABLE: tl.constexpr = True,
    HAS_QO_OFFSET: tl.constexpr = False, LAZY: tl.constexpr = 0, V_MMA: tl.constexpr = False, MODE: tl.constexpr = 2,
    PAIR: tl.constexpr = False, SOFTMAX: tl.constexpr = True, WIDEN: tl.constexpr = True,
    P_FIXED: tl.constexpr = False, F16_ACC: tl.constexpr = False,
    V_FIRST: tl.constexpr = False,
):
    """MODE 0: return; 1: block list + store; 2: block list + the key loop's loads, two wgmmas per
    tile; 3: the decode kernel's lazy loop (fp8), without the softmax (``SOFTMAX=False``: the masked
    logits are P) and / or the V widening (``WIDEN=False``: V·Qᵀ from shared memory instead of
    Oᵀ += Vᵀ·Pᵀ). ``PAIR`` (token-major caches): each tile reads K of the head pair (kvh, kvh ^ 1) instead of
    K and V of kvh: the same bytes and boxes, but the two boxes of a tile cover adjacent 128-byte
    pieces of each key row. MODE 4: the lazy loop with Vᵀ made by an identity QGMMA (flat caches,
    V as two 64-column boxes). ``P_FIXED`` (MODE 3): Pᵀ of the P·V wgmma is a loop-invariant tile, so V
    is still gathered and widened but no P goes through shared memory per tile."""
    if MODE == 0:
        return
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    n_kvh = tl.num_programs(1)
    split = tl.program_id(2)
    ubase = (t.to(tl.int64) * n_kvh + kvh) * C
    hl = tl.arange(0, GP)
    h = kvh * RATIO + hl
    hvalid = hl < RATIO
    offs_d = tl.arange(0, HEAD_DIM)
    qt = tl.load(q_ptr + t.to(tl.int64) * stride_qt + h[None, :] * stride_qh + offs_d[:, None],
                 mask=hvalid[None, :], other=0.0)
    pos, kv_len, cnt = sd.token_block_list(
        t, kvh, split, ubase, idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B,
        n_iter, page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages,
        W, u_page_ptr, u_blk_ptr, u_cnt_ptr + t * n_kvh + kvh, BLOCK_W, NUM_SPLITS, CAUSAL, USE_PAGE_TABLE,
        HAS_QO_OFFSET)
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    acc = tl.zeros([KEYS, GP], dtype=tl.float32)
    if MODE == 2:
        KPB: tl.constexpr = 128 // KEYS
        e_last = tl.maximum(e1 - 1, 0)
        page_n = tl.load(u_page_ptr + ubase + tl.minimum(e0, e_last))
        for it in range(e0 * KPB, e1 * KPB):
            k0 = (it % KPB) * KEYS
            page = page_n
            e_n = tl.minimum((it + 1) // KPB, e_last)
            page_n = tl.load(u_page_ptr + ubase + e_n)
            if PAIR and not HEAD_MAJOR:  # K of this head and its neighbour: the same bytes as K + V, in aligned
                kt = k_desc.load([page * 128 + k0, (kvh // 2 * 2) * HEAD_DIM])  # 2 x 128-value rows
                vt = k_desc.load([page * 128 + k0, (kvh // 2 * 2 + 1) * HEAD_DIM])
            else:
                kt, vt = sd.load_kv_tile(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT, HEAD_MAJOR)
            acc = tl.dot(kt, qt, acc)
            acc = tl.dot(vt, qt, acc)
    tot = tl.sum(acc, axis=0) + pos.to(tl.float32) * 0.0
    if MODE == 3:  # the decode kernel's lazy loop with its softmax and / or V widening left out
        limit = visible_limit(pos, kv_len, CAUSAL)
        offs_n = tl.arange(0, KEYS)
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_k = tl.zeros([KEYS, GP], dtype=tl.float32)
        acc_o = tl.zeros([HEAD_DIM, GP], dtype=tl.float32)
        KPB3: tl.constexpr = 128 // KEYS
        p_const = (tl.arange(0, KEYS)[:, None] * 0.001 + tl.arange(0, GP)[None, :] + pos).to(tl.float16)
        e_last = tl.maximum(e1 - 1, 0)
        page_n = tl.load(u_page_ptr + ubase + tl.minimum(e0, e_last))
        blk_n = tl.load(u_blk_ptr + ubase + tl.minimum(e0, e_last))
        for it in range(e0 * KPB3, e1 * KPB3):
            k0 = (it % KPB3) * KEYS
            page = page_n
            blk = blk_n
            e_n = tl.minimum((it + 1) // KPB3, e_last)
            page_n = tl.load(u_page_ptr + ubase + e_n)
            blk_n = tl.load(u_blk_ptr + ubase + e_n)
            kt, vt = sd.load_kv_tile(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT, HEAD_MAJOR)
            s = tl.dot(kt, qt) * qk_scale
            kpos = blk * 128 + k0 + offs_n
            s = tl.where((kpos <= limit)[:, None], s, float("-inf"))
            if SOFTMAX:
                p, m_i, l_k, acc_o = sd.lazy_softmax_step(s, m_i, l_k, acc_o, LAZY)
            else:
                p = tl.where((kpos <= limit)[:, None], s, 0.0)
            l_k += p
            if WIDEN and P_FIXED:  # Pᵀ loop-invariant: V gathered and widened, no per-tile P store
                acc_o += tl.dot(tl.trans(vt.to(tl.float16)), p_const)
            elif WIDEN:
                acc_o += tl.dot(tl.trans(vt.to(tl.float16)), p.to(tl.float16))
            else:
                acc = tl.dot(vt, qt, acc)
        tot += tl.sum(acc, axis=0) + tl.sum(acc_o, axis=0) + tl.sum(l_k, axis=0) + m_i
    if MODE == 4:  # the lazy loop with Vᵀ from an identity QGMMA: V as two [KEYS, 64] boxes
        limit = visible_limit(pos, kv_len, CAUSAL)
        offs_n = tl.arange(0, KEYS)
        half = tl.arange(0, HEAD_DIM // 2)
        eye = tl.where(half[:, None] == half[None, :], 1.0, 0.0).to(tl.float8e4nv)  # eye · Vᵀ = Vᵀ exactly
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_k = tl.zeros([KEYS, GP], dtype=tl.float32)
        acc_lo = tl.zeros([HEAD_DIM // 2, GP], dtype=tl.float32)
        acc_hi = tl.zeros([HEAD_DIM // 2, GP], dtype=tl.float32)
        KPB4: tl.constexpr = 128 // KEYS
        e_last = tl.maximum(e1 - 1, 0)
        page_n = tl.load(u_page_ptr + ubase + tl.minimum(e0, e_last))
        blk_n = tl.load(u_blk_ptr + ubase + tl.minimum(e0, e_last))
        for it in range(e0 * KPB4, e1 * KPB4):
            k0 = (it % KPB4) * KEYS
            page = page_n
            blk = blk_n
            e_n = tl.minimum((it + 1) // KPB4, e_last)
            page_n = tl.load(u_page_ptr + ubase + e_n)
            blk_n = tl.load(u_blk_ptr + ubase + e_n)
            kt, v_lo, v_hi = sd.load_kv_tile_halves(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT,
                                                    HEAD_MAJOR)
            if V_FIRST:  # Vᵀ issued before Sᵀ, its latency under the softmax
                vt_lo = tl.dot(eye, tl.trans(v_lo), out_dtype=tl.float16)
                vt_hi = tl.dot(eye, tl.trans(v_hi), out_dtype=tl.float16)
            s = tl.dot(kt, qt) * qk_scale
            kpos = blk * 128 + k0 + offs_n
            s = tl.where((kpos <= limit)[:, None], s, float("-inf"))
            m_old = m_i
            p, m_i, l_k, acc_lo = sd.lazy_softmax_step(s, m_i, l_k, acc_lo, LAZY)
            acc_hi = acc_hi * tl.where(m_i == m_old, 1.0, tl.exp2(m_old - m_i))[None, :]
            l_k += p
            p16 = p.to(tl.float16)
            if V_FIRST:
                acc_lo += tl.dot(vt_lo, p16)
                acc_hi += tl.dot(vt_hi, p16)
            elif F16_ACC:  # the identity product accumulated in fp16 (exact): no conversion
                vt_lo = tl.dot(eye, tl.trans(v_lo), out_dtype=tl.float16)
                acc_lo += tl.dot(vt_lo, p16)
                vt_hi = tl.dot(eye, tl.trans(v_hi), out_dtype=tl.float16)
                acc_hi += tl.dot(vt_hi, p16)
            else:
                vt_lo = tl.dot(eye, tl.trans(v_lo))  # [64 d, KEYS] fp32, exact
                acc_lo += tl.dot(vt_lo.to(tl.float16), p16)
                vt_hi = tl.dot(eye, tl.trans(v_hi))
                acc_hi += tl.dot(vt_hi.to(tl.float16), p16)
        tot += tl.sum(acc_lo, axis=0) + tl.sum(acc_hi, axis=0) + tl.sum(l_k, axis=0) + m_i
    tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h * stride_lh, tot, mask=hvalid)


class _Swap:
    """Launches ``floor_kernel`` (with ``over`` launch options) wherever the decode kernel launches."""

    def __init__(self, maxnreg=None, **over):
        self.over, self.maxnreg = over, maxnreg

    def __getitem__(self, grid):
        def launch(*a, **kw):
            kw.update(self.over)
            kw.pop("maxnreg", None)
            if self.maxnreg:
                kw["maxnreg"] = self.maxnreg
            # MODE 4 reads V as two 64-column boxes, the others as one: the V descriptor's box as
            # the mode needs, whatever the module's default (``V_MMA``) built
            from triton.tools.tensor_descriptor import TensorDescriptor

            v = a[4]
            width = kw["HEAD_DIM"] // 2 if kw.get("MODE") == 4 else kw["HEAD_DIM"]
            if v.block_shape[-1] != width:
                a = (*a[:4], TensorDescriptor(v.base, v.shape, v.strides, [*v.block_shape[:-1], width]), *a[5:])
            kw["V_MMA"] = False
            floor_kernel[grid](*a, **kw)
        return launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sel", type=int, default=16)
    ap.add_argument("--dtype", default="fp8", choices=["fp8", "bf16"])
    ap.add_argument("--set", default="floors", choices=["floors", "hnd", "configs"],
                    help="floors: the token-major cache's floors; hnd: a head-major copy, the loop's parts; "
                         "configs: launch configurations on both layouts")
    args = ap.parse_args()
    bv.SEL = sel = args.sel
    dtype = torch.float8_e4m3fn if args.dtype == "fp8" else torch.bfloat16
    fp8 = dtype == torch.float8_e4m3fn
    print(torch.cuda.get_device_name(), flush=True)
    rate = bv.copy_gbps()
    torch.cuda.empty_cache()
    pb = bv.problem(128, 65536, dtype)
    B = 128
    out = torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, HQ, device="cuda")
    nbytes = 2.0 * B * HKV * sel * BLK * D * pb["k"].element_size()
    zero_table = torch.zeros_like(pb["page_table"])
    from mate.ops.msa.sparse_attention import sparse_attention

    kv_hnd = [x.permute(0, 2, 1, 3).contiguous() for x in (pb["k"], pb["v"])] if args.set != "floors" else None

    def call(kernel=None, table=None, variant=None, hnd=False, splits=1):
        base = dict(sd.DECODE_VARIANT)

        def fn():
            keep = sd.msa_decode_t_kernel
            sd.DECODE_VARIANT.update(variant or {})
            if kernel is not None:
                sd.msa_decode_t_kernel = kernel
            try:
                k, v = kv_hnd if hnd else (pb["k"], pb["v"])
                sparse_attention(pb["q"], k, v, kv_block_indexes=pb["kv_block_indexes"],
                                 page_table=pb["page_table"] if table is None else table,
                                 qo_indptr=pb["qo_indptr"], kv_lens=pb["kv_lens"], out=out, lse=lse,
                                 causal=True, decode=True, num_kv_splits=splits, num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = keep
                sd.DECODE_VARIANT.clear()
                sd.DECODE_VARIANT.update(base)
        return fn

    pre = "fp8_" if fp8 else ""
    loop = {"maxnreg": sd.t_config(fp8)[2], "MODE": 3}  # the decode kernel's launch, register cap kept
    sets = {
        "floors": {
            "default": call(),
            "default, L2 data": call(table=zero_table),
            "floor 64 keys 3 stages": call(_Swap(MODE=2, num_stages=3)),
            "floor 64 keys 4 stages": call(_Swap(MODE=2, num_stages=4)),
            "floor 64 keys 6 stages": call(_Swap(MODE=2, num_stages=6)),
            "floor 64 keys 3 st, head pairs": call(_Swap(MODE=2, num_stages=3, PAIR=True)),
            "floor 128 keys 3 stages": call(_Swap(MODE=2, num_stages=3), variant={pre + "keys": 128}),
            "floor 64 keys 3 st, 8 warps": call(_Swap(MODE=2, num_stages=3, num_warps=8)),
            "list only": call(_Swap(MODE=1)),
            "null": call(_Swap(MODE=0)),
        },
        "hnd": {
            "NHD default": call(),
            "NHD default, V gathered": call(variant={"fp8_v": "gather"}),
            "HND default, V gathered": call(hnd=True, variant={"fp8_v": "gather"}),
            "NHD floor": call(_Swap(MODE=2)),
            "HND default": call(hnd=True),
            "HND default, L2 data": call(hnd=True, table=zero_table),
            "HND floor": call(_Swap(MODE=2), hnd=True),
            "HND loop": call(_Swap(**loop), hnd=True),
            "HND loop, L2 data": call(_Swap(**loop), hnd=True, table=zero_table),
            "HND loop no softmax": call(_Swap(SOFTMAX=False, **loop), hnd=True),
            "HND loop no softmax, L2": call(_Swap(SOFTMAX=False, **loop), hnd=True, table=zero_table),
            "HND loop no widening": call(_Swap(WIDEN=False, **loop), hnd=True),
            "HND loop no widening, L2": call(_Swap(WIDEN=False, **loop), hnd=True, table=zero_table),
            "HND loop neither": call(_Swap(SOFTMAX=False, WIDEN=False, **loop), hnd=True),
            "HND loop, P fixed": call(_Swap(P_FIXED=True, **loop), hnd=True),
            "HND loop, P fixed, L2": call(_Swap(P_FIXED=True, **loop), hnd=True, table=zero_table),
            "NHD loop": call(_Swap(**loop)),
            "HND loop, Vᵀ by identity QGMMA": call(_Swap(**dict(loop, MODE=4)), hnd=True),
            "HND loop, Vᵀ by identity QGMMA, L2": call(_Swap(**dict(loop, MODE=4)), hnd=True, table=zero_table),
            "NHD loop, Vᵀ by identity QGMMA": call(_Swap(**dict(loop, MODE=4))),
            "HND loop, identity fp16": call(_Swap(**dict(loop, MODE=4, F16_ACC=True)), hnd=True),
            "HND loop, identity fp16, L2": call(_Swap(**dict(loop, MODE=4, F16_ACC=True)), hnd=True,
                                                table=zero_table),
            "NHD loop, identity fp16": call(_Swap(**dict(loop, MODE=4, F16_ACC=True))),
            "HND loop, identity fp16 first": call(_Swap(**dict(loop, MODE=4, V_FIRST=True)), hnd=True),
            "NHD loop, identity fp16 first": call(_Swap(**dict(loop, MODE=4, V_FIRST=True))),
            "NHD loop no widening": call(_Swap(WIDEN=False, **loop)),
            "HND list only": call(_Swap(MODE=1), hnd=True),
        },
    }
    big = {pre + "keys": 128, pre + "maxnreg": None}  # 128-key tiles, no register cap (2 programs per SM)
    sets["configs"] = {
        "NHD default": call(),
        "NHD 128 keys 3 st uncapped": call(variant=dict(big, **{pre + "stages": 3})),
        "HND default": call(hnd=True),
        "HND 2 stages": call(hnd=True, variant={pre + "stages": 2}),
        "HND lazy 0": call(hnd=True, variant={pre + "lazy": 0}),
        "HND 2 splits": call(hnd=True, splits=2),
        "HND 64 keys uncapped": call(hnd=True, variant={pre + "maxnreg": None}),
        "HND 128 keys 3 st uncapped": call(hnd=True, variant=dict(big, **{pre + "stages": 3})),
        "HND 128 keys 2 st uncapped": call(hnd=True, variant=dict(big, **{pre + "stages": 2})),
        "HND floor": call(_Swap(MODE=2), hnd=True),
    }
    cases = sets[args.set]
    for fn in cases.values():
        fn()
    torch.cuda.synchronize()
    times = time_interleaved(cases, rounds=5, iters=50)
    print(f"--- {args.dtype}: B={B} 64K Hq={HQ} Hkv={HKV} {sel} blocks, {nbytes / 1e6:.1f} MB selected K/V; "
          f"copy {rate:.0f} GB/s; 90% bar {nbytes / (0.9 * rate * 1e3):.1f} us")
    print("\n".join(bandwidth_lines(times, nbytes, rate, 32)))


if __name__ == "__main__":
    main()
