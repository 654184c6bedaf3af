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

H200, session 31 (``benchmarks/results/2026-12-01-h200-s31-probes.txt``; five machines, us, 8 calls
per replay unless noted):

- ``balance`` (one call per replay): finer units are slower. 2 / 4 splits: default 85.4 / 92.0
  against 77.1, floor 78.0 / 81.1 / 85.0 (8) against 71.4, while the combine alone costs 3.3-8.6
  (``null`` 6.4 / 8.0 / 11.7 against 3.1). %globaltimer timelines: programs with equal work end
  47-65 us (floor), the same SMs early in every launch (correlation 0.95-0.97); SMs running 3
  programs end no earlier than SMs running 4, so DRAM is shared per program, not per SM.
- ``gaps``: a replay's kernel starts 1.0 us after the node before it and ends 1.0-1.2 us before the
  next; the programs' span is the kernel's time (floor 67.5, loop 71.5 NHD).
- ``delay``: the floor with a pause per tile instead of the decode's work (``DELAY``: ``nanosleep``,
  the warps yield the SM; or a ``%clock64`` spin) loses what the decode loses: NHD 69.0 -> 70.8
  (0.5 us sleep) / 72.1 (1 us) / 72.1 (1000-clock spin) / 73.3 (2000) against the decode's 73.7;
  HND 64.8 -> 66.8 / 68.7 / 68.0 / 69.8 against 69.8. Two stages (at most one tile in flight
  beyond the awaited one) cost nothing without a pause (NHD 69.2 against 69.0) and 13% with a
  1 us one (78.6). So the decode's gap to its floor is the time its programs spend per tile
  (~1.4 us: the SM's work per tile, 0.35 us with the data in L2, shared by four programs),
  whatever fills that time. ``probe_msa_refill.py`` (Gluon ring, three tiles always in flight)
  loses as much to the same pause whether a slot is refilled right after its QGMMAs or after
  the pause: it is not the load pipeline's depth. A Gluon port with the kernel's arithmetic and a
  shorter chain (one wgmma wait per product group, half the barriers; 798aaac) took the
  kernel's time: it is not the chain's latency either.
- ``prefetch``: a TMA L2 prefetch (``cp.async.bulk.prefetch.tensor``, one per K / V tile, thread
  0, tensor maps in global memory) of the tile 2 or 3 ahead makes every case slower (a fast
  machine: NHD floor 66.3 -> 70.9 / 71.9, the loop 69.6 -> 74.8 / 76.9, HND floor 63.7 -> 71.7).
  That machine ran the decode at 70.5-71.0 us = 89.3-89.9% of copy token-major (floor 95.6%) and
  68.2-68.4 = 92.6-92.9% head-major; the others today 73.7-74.6 (84.5-85.5%, floor 91%).
- ``compute``: the loop on one resident tile (``HOIST``: the first tile loaded once, every
  iteration computing on it) takes 39.2 us per call against the list alone's 2.5, so the SM's
  work is ~0.29 us per 64-key tile per SM, ~1.15 us per tile for each of its four programs: by
  the pause calibration above, the decode's 4-5 us over its floor (73.6-73.8 against 68.8-69.2
  token-major; 69.7-69.9 against 64.8-65.1 head-major). The ``L2 data`` rows (every program on
  one page: 47 us) are bound by that page's L2 slices, not by the SM. Taken apart (Vᵀ first, as
  the kernel; us per call, NHD and HND alike): whole 36.3, without the Vᵀ products 33.7,
  without the softmax 28.8, without P·V (nor Vᵀ) 22.9, Sᵀ alone 11.0: P·V with P's trip through
  shared memory (fp16 store, fence, CTA barrier, 8 HGMMA) is the largest part (~10.8), then the
  lazy softmax with its flag exchange (~7.4).
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
    V_FIRST: tl.constexpr = False, DELAY: tl.constexpr = 0, tl_ptr=None,
    PF: tl.constexpr = 0, kmap=0, vmap=0, HOIST: tl.constexpr = False, NO_ID: tl.constexpr = False,
    NO_PV: tl.constexpr = False,
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
    if tl_ptr is not None:  # timeline: (start, end, SM) of each program, %globaltimer in ns
        t_start = _globaltimer()
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
    if tl_ptr is not None:
        t_list = _globaltimer() + cnt.to(tl.int64) * 0  # after the list (the count orders it)
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
            if PF > 0:  # an L2 prefetch (TMA) of the K / V tile PF tiles ahead
                _prefetch_tile(kmap, vmap, u_page_ptr + ubase, it + PF, e_last, kvh, n_kvh, HEAD_DIM, KEYS, KPB,
                               HEAD_MAJOR)
            if PAIR and not HEAD_MAJOR:  # K of this head and its neighbour: the same bytes as K + V, in aligned
                kt = k_desc.load([page * 128 + k0, (kvh // 2 * 2) * HEAD_DIM])  # 2 x 128-value rows
                vt = k_desc.load([page * 128 + k0, (kvh // 2 * 2 + 1) * HEAD_DIM])
            else:
                kt, vt = sd.load_kv_tile(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT, HEAD_MAJOR)
            acc = tl.dot(kt, qt, acc)
            acc = tl.dot(vt, qt, acc)
            if DELAY != 0:  # a stand-in for the decode's per-tile work: a pause before the next tile
                acc = _delay(acc, DELAY)
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
            page_n, blk_n = sd.next_list_entry(u_page_ptr, u_blk_ptr, ubase, it, e_last, KPB3)
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
        if HOIST:  # compute only: the first tile loaded once, every iteration computes on it
            kt, v_lo, v_hi = sd.load_kv_tile_halves(k_desc, v_desc, page_n, kvh, n_kvh, 0, HEAD_DIM, KEYS, FLAT,
                                                    HEAD_MAJOR)
            if NO_ID:  # (with V_FIRST) Vᵀ made once, outside the loop
                vt_lo = tl.dot(eye, tl.trans(v_lo), out_dtype=tl.float16)
                vt_hi = tl.dot(eye, tl.trans(v_hi), out_dtype=tl.float16)
        for it in range(e0 * KPB4, e1 * KPB4):
            k0 = (it % KPB4) * KEYS
            page = page_n
            blk = blk_n
            page_n, blk_n = sd.next_list_entry(u_page_ptr, u_blk_ptr, ubase, it, e_last, KPB4)
            if PF > 0:
                _prefetch_tile(kmap, vmap, u_page_ptr + ubase, it + PF, e_last, kvh, n_kvh, HEAD_DIM, KEYS, KPB4,
                               HEAD_MAJOR)
            if not HOIST:
                kt, v_lo, v_hi = sd.load_kv_tile_halves(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT,
                                                        HEAD_MAJOR)
            if V_FIRST and not NO_ID:  # Vᵀ issued before Sᵀ, its latency under the softmax
                vt_lo = tl.dot(eye, tl.trans(v_lo), out_dtype=tl.float16)
                vt_hi = tl.dot(eye, tl.trans(v_hi), out_dtype=tl.float16)
            s = tl.dot(kt, qt) * qk_scale
            kpos = blk * 128 + k0 + offs_n
            s = tl.where((kpos <= limit)[:, None], s, float("-inf"))
            if SOFTMAX:
                m_old = m_i
                p, m_i, l_k, acc_lo = sd.lazy_softmax_step(s, m_i, l_k, acc_lo, LAZY)
                acc_hi = acc_hi * tl.where(m_i == m_old, 1.0, tl.exp2(m_old - m_i))[None, :]
            else:  # the masked logits are P
                p = tl.where((kpos <= limit)[:, None], s, 0.0)
            l_k += p
            p16 = p.to(tl.float16)
            if NO_PV:
                pass
            elif V_FIRST:
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
    if tl_ptr is not None:
        row = tl_ptr + ((split * tl.num_programs(0) + t) * n_kvh + kvh) * 4
        tl.store(row, t_start)
        tl.store(row + 1, _globaltimer())
        tl.store(row + 3, t_list)
        tl.store(row + 2, tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False,
                                                    pack=1).to(tl.int64))


@triton.jit
def _delay(x, DELAY: tl.constexpr):
    """``x`` (fp32, 8 values per thread here) after a pause, one eighth per value: DELAY 1 / 2
    sleep ~0.5 / ~1 us in all (``nanosleep``: the warps yield the SM), -1 / -2 spin ~1000 / ~2000
    clocks on ``%clock64`` (the warps keep issuing)."""
    if DELAY == 1:
        return tl.inline_asm_elementwise("nanosleep.u32 62; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=False, pack=1)
    elif DELAY == 2:
        return tl.inline_asm_elementwise("nanosleep.u32 125; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=False, pack=1)
    elif DELAY == -1:
        return tl.inline_asm_elementwise(
            "{ .reg .u64 t0, t1; .reg .pred p; mov.u64 t0, %clock64; SPIN_LOOP: mov.u64 t1, %clock64; "
            "sub.u64 t1, t1, t0; setp.lt.u64 p, t1, 125; @p bra SPIN_LOOP; mov.b32 $0, $1; }",
            "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .u64 t0, t1; .reg .pred p; mov.u64 t0, %clock64; SPIN_LOOP: mov.u64 t1, %clock64; "
            "sub.u64 t1, t1, t0; setp.lt.u64 p, t1, 250; @p bra SPIN_LOOP; mov.b32 $0, $1; }",
            "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _prefetch_tile(kmap, vmap, pages, tile, e_last, kvh, n_kvh, HEAD_DIM: tl.constexpr, KEYS: tl.constexpr,
                   KPB: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    """``cp.async.bulk.prefetch.tensor`` into L2 of K and V tile ``tile`` (clamped to the list) by
    thread 0, through tensor maps in global memory (:func:`tensormap_2d`) of the 2D cache views."""
    e = tl.minimum(tile // KPB, e_last)
    page = tl.load(pages + e)
    row, col = sd.flat_tile_origin(page, kvh, n_kvh, (tile % KPB) * KEYS, HEAD_DIM, HEAD_MAJOR)
    asm: tl.constexpr = ("{ .reg .pred p; .reg .u32 tid; mov.u32 tid, %tid.x; setp.eq.u32 p, tid, 0; "
                         "@p cp.async.bulk.prefetch.tensor.2d.L2.global.tile [$1, {$2, $3}]; mov.b32 $0, $2; }")
    tl.inline_asm_elementwise(asm, "=r,l,r,r", [kmap, col, row], dtype=tl.int32, is_pure=False, pack=1)
    tl.inline_asm_elementwise(asm, "=r,l,r,r", [vmap, col, row], dtype=tl.int32, is_pure=False, pack=1)


def tensormap_2d(x: torch.Tensor, box_rows: int, box_cols: int) -> torch.Tensor:
    """A CUtensorMap (uint8 elements, no swizzle, 128-byte L2 promotion) of the 2D byte view ``x``
    with [box_rows, box_cols] boxes, encoded by the driver and copied to a 128-byte device tensor."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    raw = ctypes.create_string_buffer(256)
    at = (ctypes.addressof(raw) + 63) // 64 * 64
    dims = (ctypes.c_uint64 * 2)(x.shape[1] * x.element_size(), x.shape[0])
    strides = (ctypes.c_uint64 * 1)(x.stride(0) * x.element_size())
    box = (ctypes.c_uint32 * 2)(box_cols * x.element_size(), box_rows)
    ones = (ctypes.c_uint32 * 2)(1, 1)
    res = lib.cuTensorMapEncodeTiled(ctypes.c_void_p(at), 0, 2, ctypes.c_void_p(x.data_ptr()), dims, strides, box,
                                     ones, 0, 0, 2, 0)
    assert res == 0, f"cuTensorMapEncodeTiled failed: {res}"
    host = torch.frombuffer(bytearray(ctypes.string_at(at, 128)), dtype=torch.uint8)
    return host.to(x.device)


@triton.jit
def stamp_kernel(ptr):
    """One %globaltimer stamp (a graph node before / after the timed call)."""
    tl.store(ptr, _globaltimer())


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


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
    ap.add_argument("--set", default="floors",
                    choices=["floors", "hnd", "configs", "balance", "timeline", "gaps", "order", "delay",
                             "prefetch", "compute"],
                    help="floors: the token-major cache's floors; hnd: a head-major copy, the loop's parts; "
                         "configs: launch configurations on both layouts; balance: finer units "
                         "(splits) and the programs' timelines; timeline: the floor and the loop stamped "
                         "inside the timed replays; gaps: where a replay's time goes outside the programs; "
                         "order: the kernel against loop copies with Vᵀ made at other points, 8 calls per replay; "
                         "delay: the floor with a pause per tile in place of the compute; prefetch: TMA L2 "
                         "prefetches of the tile 2-3 ahead; compute: the loop on one resident tile")
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
    m4 = dict(loop, MODE=4)
    sets["order"] = {  # 8 calls per replay (the benchmark's layer loop)
        f"{lay} {name}": [fn] * 8
        for lay, hnd in (("NHD", False), ("HND", True))
        for name, fn in (("default", call(hnd=hnd)),
                         ("default, V gathered", call(hnd=hnd, variant={"fp8_v": "gather"})),
                         ("floor", call(_Swap(MODE=2), hnd=hnd)),
                         ("loop identity fp32 after softmax", call(_Swap(**m4), hnd=hnd)),
                         ("loop identity fp16 after softmax", call(_Swap(F16_ACC=True, **m4), hnd=hnd)),
                         ("loop identity fp16 first (as kernel)", call(_Swap(V_FIRST=True, **m4), hnd=hnd)))
    }
    maps = {}
    if args.set == "prefetch":  # tensor maps of the 2D cache views for the L2 prefetches
        for lay, (kk, vv) in (("NHD", (pb["k"], pb["v"])), ("HND", kv_hnd)):
            views = [x.view(-1, D) if lay == "HND" else x.view(-1, HKV * D) for x in (kk, vv)]
            mk, mv = (tensormap_2d(x.view(torch.uint8), 64, D * x.element_size()) for x in views)
            maps[lay] = (mk, mv, dict(kmap=mk.data_ptr(), vmap=mv.data_ptr()))
    sets["prefetch"] = {
        f"{lay} {name}": [fn] * 8
        for lay, hnd in (("NHD", False), ("HND", True))
        for name, fn in (("default", call(hnd=hnd)), ("floor", call(_Swap(MODE=2), hnd=hnd)),
                         ("floor, prefetch 2 ahead", call(_Swap(MODE=2, PF=2, **maps[lay][2]), hnd=hnd)),
                         ("floor, prefetch 3 ahead", call(_Swap(MODE=2, PF=3, **maps[lay][2]), hnd=hnd)),
                         ("floor, sleep 1 us", call(_Swap(MODE=2, DELAY=2), hnd=hnd)),
                         ("floor, sleep 1 us, prefetch 2 ahead", call(_Swap(MODE=2, DELAY=2, PF=2, **maps[lay][2]),
                                                                      hnd=hnd)),
                         ("floor, sleep 1 us, prefetch 3 ahead", call(_Swap(MODE=2, DELAY=2, PF=3, **maps[lay][2]),
                                                                      hnd=hnd)),
                         ("loop", call(_Swap(**m4), hnd=hnd)),
                         ("loop, prefetch 2 ahead", call(_Swap(PF=2, **m4, **maps[lay][2]), hnd=hnd)),
                         ("loop, prefetch 3 ahead", call(_Swap(PF=3, **m4, **maps[lay][2]), hnd=hnd)))
    } if maps else {}
    sets["compute"] = {  # 8 calls per replay
        f"{lay} {name}": [fn] * 8
        for lay, hnd in (("NHD", False), ("HND", True))
        for name, fn in (("default", call(hnd=hnd)), ("floor", call(_Swap(MODE=2), hnd=hnd)),
                         ("loop", call(_Swap(**m4), hnd=hnd)),
                         ("loop, compute only (first tile loaded once)", call(_Swap(HOIST=True, **m4), hnd=hnd)),
                         ("compute only, as the kernel (Vᵀ first)", call(_Swap(HOIST=True, V_FIRST=True, **m4),
                                                                         hnd=hnd)),
                         ("compute only, no Vᵀ products", call(_Swap(HOIST=True, V_FIRST=True, NO_ID=True, **m4),
                                                               hnd=hnd)),
                         ("compute only, no softmax", call(_Swap(HOIST=True, V_FIRST=True, SOFTMAX=False, **m4),
                                                           hnd=hnd)),
                         ("compute only, no P·V", call(_Swap(HOIST=True, V_FIRST=True, NO_PV=True, **m4), hnd=hnd)),
                         ("compute only, Sᵀ alone", call(_Swap(HOIST=True, V_FIRST=True, NO_ID=True, SOFTMAX=False,
                                                               NO_PV=True, **m4), hnd=hnd)),
                         ("loop, L2 data", call(_Swap(**m4), hnd=hnd, table=zero_table)),
                         ("list only", call(_Swap(MODE=1), hnd=hnd)))
    }
    sets["delay"] = {
        f"{lay} {name}": [fn] * 8
        for lay, hnd in (("NHD", False), ("HND", True))
        for name, fn in (("default", call(hnd=hnd)), ("floor", call(_Swap(MODE=2), hnd=hnd)),
                         ("floor, sleep 0.5 us per tile", call(_Swap(MODE=2, DELAY=1), hnd=hnd)),
                         ("floor, sleep 1 us per tile", call(_Swap(MODE=2, DELAY=2), hnd=hnd)),
                         ("floor, spin 1000 clocks per tile", call(_Swap(MODE=2, DELAY=-1), hnd=hnd)),
                         ("floor, spin 2000 clocks per tile", call(_Swap(MODE=2, DELAY=-2), hnd=hnd)),
                         ("floor, 2 stages", call(_Swap(MODE=2, num_stages=2), hnd=hnd)),
                         ("floor, 2 stages, sleep 1 us per tile", call(_Swap(MODE=2, num_stages=2, DELAY=2), hnd=hnd)))
    }
    sets["timeline"] = {"NHD default": call(), "HND default": call(hnd=True)}
    sets["balance"] = {
        "NHD default": call(),
        "NHD default, 2 splits": call(splits=2),
        "NHD default, 4 splits": call(splits=4),
        "NHD floor": call(_Swap(MODE=2)),
        **{f"NHD floor, {n} splits": call(_Swap(MODE=2), splits=n) for n in (2, 4, 8)},
        **{f"null, {n} splits": call(_Swap(MODE=0), splits=n) for n in (1, 2, 4, 8)},
        "HND floor": call(_Swap(MODE=2), hnd=True),
        **{f"HND floor, {n} splits": call(_Swap(MODE=2), hnd=True, splits=n) for n in (4, 8)},
    }
    bufs = {}
    if args.set == "timeline":
        for lay in ("NHD", "HND"):
            for name, over in (("floor", dict(MODE=2)), ("loop", dict(loop, MODE=4))):
                buf = bufs[f"{lay} {name}"] = torch.zeros(B * HKV * 4, dtype=torch.int64, device="cuda")
                sets["timeline"][f"{lay} {name}"] = call(_Swap(tl_ptr=buf, **over), hnd=lay == "HND")
    if args.set == "gaps":
        gaps(call, B, nbytes, rate)
        return
    cases = sets[args.set]
    for fn in cases.values():
        (fn if callable(fn) else fn[0])()
    torch.cuda.synchronize()
    times = time_interleaved(cases, rounds=5, iters=50)
    print(f"--- {args.dtype}: B={B} 64K Hq={HQ} Hkv={HKV} {sel} blocks, {nbytes / 1e6:.1f} MB selected K/V; "
          f"copy {rate:.0f} GB/s; 90% bar {nbytes / (0.9 * rate * 1e3):.1f} us")
    print("\n".join(bandwidth_lines(times, nbytes, rate, 40)))
    for label, buf in bufs.items():  # the last timed replay's stamps
        timeline_lines(label, buf.view(-1, 4))
    if args.set == "balance":
        for label, over, splits in (("NHD floor", dict(MODE=2), 1), ("NHD loop (identity Vᵀ)", dict(loop, MODE=4), 1),
                                    ("NHD floor, 4 splits", dict(MODE=2), 4), ("HND floor", dict(MODE=2), 1)):
            ends = []
            for _ in range(2):
                buf = torch.zeros(splits * B * HKV * 4, dtype=torch.int64, device="cuda")
                call(_Swap(tl_ptr=buf, **over), hnd=label.startswith("HND"), splits=splits)()
                torch.cuda.synchronize()
                ends.append(timeline_lines(label, buf.view(-1, 4)))
            a, b = ends
            print(f"  per-SM max end, run 1 against run 2: correlation {torch.corrcoef(torch.stack([a, b]))[0, 1]:.2f}")


def gaps(call, B: int, nbytes: float, rate: float, replays: int = 30) -> None:
    """Graphs of [stamp, the call, stamp] replayed behind a GPU spin: the event time of each replay
    against the stamps around it and the programs' own first start and last end (MODE 2 / 4 record
    them; the default decode only has the outer stamps). Prints medians over ``replays``."""
    import statistics

    from mate.testing.bench import SPIN_CYCLES
    from mate.testing.graphs import capture_graph

    loop = {"maxnreg": sd.t_config(True)[2], "MODE": 4}
    rows = {"NHD default": (dict(), False), "NHD floor": (dict(MODE=2), False), "NHD loop": (loop, False),
            "HND default": (dict(), True), "HND loop": (loop, True), "null": (dict(MODE=1), False)}
    print(f"--- {nbytes / 1e6:.1f} MB; copy {rate:.0f} GB/s; medians of {replays} replays (us): event time of the "
          "replay; outer stamp span; first program start - stamp before; stamp after - last program end; "
          "programs' span")
    for label, (over, hnd) in rows.items():
        ab = torch.zeros(2, dtype=torch.int64, device="cuda")
        tl_buf = torch.zeros(B * HKV * 4, dtype=torch.int64, device="cuda")
        inner = call(_Swap(tl_ptr=tl_buf, **over), hnd=hnd) if over else call(hnd=hnd)

        def body(inner=inner, ab=ab):
            stamp_kernel[(1,)](ab)
            inner()
            stamp_kernel[(1,)](ab[1:])

        graph = capture_graph(body)
        ev, outer, head, tail, span = [], [], [], [], []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            ev.append(start.elapsed_time(end) * 1e3)
            a, b = (x / 1e3 for x in ab.tolist())
            outer.append(b - a)
            if over:
                r = tl_buf.view(-1, 4)
                first, last = r[:, 0].min().item() / 1e3, r[:, 1].max().item() / 1e3
                head.append(first - a)
                tail.append(b - last)
                span.append(last - first)
        med = statistics.median
        extra = (f"  start gap {med(head):5.1f}  end gap {med(tail):5.1f}  programs {med(span):6.1f}"
                 if over else "")
        print(f"{label:14s} event {med(ev):6.1f}  stamps {med(outer):6.1f}" + extra, flush=True)


def timeline_lines(label: str, rows: torch.Tensor) -> torch.Tensor:
    """Prints the programs' start / end spread and the SMs' last ends; returns each SM's last end (us)."""
    t0 = rows[:, 0].min()
    st, en, sm = ((rows[:, 0] - t0).double() / 1e3), ((rows[:, 1] - t0).double() / 1e3), rows[:, 2]
    lst = (rows[:, 3] - t0).double() / 1e3
    q = torch.quantile(en, torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64, device=en.device))
    dur = en - st
    print(f"{label}: {rows.shape[0]} programs; starts up to {st.max():.1f} us; ends p0/10/50/90/100 "
          + " / ".join(f"{x:.1f}" for x in q.tolist()) + f"; durations {dur.min():.1f}-{dur.max():.1f} "
          f"(mean {dur.mean():.1f}); lists built by {lst.mean():.1f} (mean) / {lst.max():.1f} (last)")
    n_sm = int(sm.max()) + 1
    count = torch.bincount(sm, minlength=n_sm)
    last = torch.zeros(n_sm, dtype=torch.float64, device=en.device).scatter_reduce(0, sm, en, "amax")
    parts = []
    for c in sorted(set(count.tolist())):
        sel = last[count == c]
        parts.append(f"{int((count == c).sum())} SMs with {c}: last end {sel.min():.1f}-{sel.max():.1f} "
                     f"(mean {sel.mean():.1f})")
    print("  " + "; ".join(parts))
    return last


if __name__ == "__main__":
    main()
