"""One-warpgroup Gluon kernel of the FP8 sparse MLA decode for few heads (H <= 32), sm_90.

The 8-warp small-H kernel (``decode_gluon_small_h.py``) runs one program per SM and is bound
by its per-block compute chain, not by the gather. This variant makes each chain one
warpgroup (4 warps, all ``BLOCK_H`` heads on the wgmma N side) with its own ring of
``STAGES`` gathered tiles, so that two programs share an SM (<= 255 registers, <= 113 KB of
shared memory each) and twice as many independent chains run per SM; the plan's split
(``num_splits`` = 2 at B=128 q1) provides the programs, the combine kernel of ``decode.py``
merges them. Plans select it for H <= 16 (``num_warps=4``; at 32 heads it spills).

Per 64-row block: Sᵀ [64, BLOCK_H] = K·Qᵀ (QGMMA, K-major operands in shared memory), the
online softmax over the rows, and Oᵀ [512, BLOCK_H] += Vᵀ·Pᵀ in two halves of 256 value rows
(Vᵀ from registers, value rows permuted, see ``_perm_values``). Sᵀ of block it + 1 is issued
before the P·V of block it. P·V runs on FP8 tensor cores by default (``WG_PV_FP8``, session 22):
Vᵀ stays e4m3 (each 4 x 4 block of rows and values a thread loads is byte-transposed with 8
PRMT into the 8-bit A operand, ``decode_gluon_small_h._vt_e4m3``, instead of 128 F2FP widenings per block), and
P is split into hi = e4m3(2^8 P) and lo = e4m3(2^8 P - hi), two QGMMAs on the same Vᵀ, which
carry P to ~2^-8 relative, about bf16's precision (``decode_gluon_small_h._stage_p``). The operand's k order pairs
a thread's rows r and r + 8, so P is stored as 16-bit pieces. sm_90, 16 heads, split: 203
instead of 255 registers, 696 instead of 754 loop instructions; dual kernel 730 (788). The
e4m3 operand is rebuilt each iteration: carried across the loop it took one register per byte
(1069 instructions). The fp16 path (``pv_fp8=False``) stays selectable.

The output (session 23): a per-program ``%globaltimer`` timeline of the dual kernel at B=128 q1
(``benchmarks/probe_sparse_mla_timeline.py``) put 2.9-4.8 us (median 3.8, of a 46 us launch)
between the two chains' end and the program's end: the merge and 64 two-byte stores per thread
at the permuted value addresses. ``_store_halves`` now puts the value rows back in order by a
register renaming and writes 8 consecutive values of a head per 16-byte store. H200,
interleaved, bit-identical outputs (us): B=128 q1 48.5 -> 45.6, B=64 q2 47.3 -> 44.3, B=32 q2
(2 dual programs + combine) 31.9 -> 28.7; the benchmark's B=128 q1 row 49.3 -> 45.2 us, 81% of
copy.

The ring keeps ``STAGES`` (2) whole 576-byte rows per slot. Gather first: Vᵀ half 1 of block it
is read (e4m3 bytes, widened later) before the barrier that publishes P, so that barrier also
frees block it's slot; the gather of block it + STAGES is issued right after P·V half 0, before
the wait for block it + 1 (``wait_group(STAGES - 1)``): with 2 stages two gathers are in flight
during that wait (the block being computed lives in registers). sm_90, 16 heads, split plans:
754 instructions and 5 CTA barriers per block, 255 registers, no spills in the loop.

H200 (top-k 2048, interleaved CUDA-graph replays, copy 4261 GB/s; us, gather first against the
previous early refill, bit-identical outputs): B=128 q1 2 splits 56.8 vs 57.6 (62.3% of copy),
B=32 q2 4 splits 37.1 vs 38.5, B=64 q2 2 splits 55.0 vs 57.1; the split combine alone 4.2 us.
Earlier schedules: early refill (slot refilled once Vᵀ half 1's bytes were in registers, after
the wait for block it + 1; 766 instructions, 6 barriers) 58.2 at B=128 q1 (copy 4200 GB/s),
late refill (after the Sᵀ / P·V half 0 wait) 59.8. Earlier run (copy 4188 GB/s, late refill)
against the 8-warp kernel: B=128 q1 61.5 vs 68.8, B=64 q1 4 splits 40.4 vs 43.2, B=64 q2 58.4
vs 66.0, B=32 q2 38.9 vs 42.7.

Dual kernel (``CHAINS=2``, plans with ``chains=2``): the same chain
twice in one program, the second warpgroup as a ``gl.warp_specialize`` worker (each partition's
CTA barriers are named 128-thread barriers; both run at 256 registers), each with its own ring,
over consecutive halves of the program's slots; the worker hands its unnormalised Oᵀ halves, row
max and sums to the default warpgroup through 32 KB of shared memory (one mbarrier), which
merges them and stores. Same two chains per SM as two one-warpgroup programs (203 KB, one
program per SM), but a plan that wanted two chains per query position needs no combine launch
and no partial round trip (sm_90: 255 registers, no spills in the loops). H200 (top-k 2048,
interleaved, copy 4234 GB/s; us, one chain per program -> dual): B=128 q1 H=16 55.1 -> 50.5
(64.7% -> 70.6% of copy), B=64 q1 37.7 -> 34.5, B=64 q2 53.3 -> 49.6, B=32 q2 35.6 -> 33.5; B=1
q1 14.6 -> 18.9 (8 chains: pairing them halves the SMs that gather, so the plan keeps one chain
per program when the chains are fewer than the SMs).

Tried and removed (the earlier run, us at B=128 q1 / B=64 q1 / B=64 q2 / B=32 q2): a split ring
(values [0, 256) and the rotary part in 2 slots, values [256, 512) in 3, each part issued
1-1.5 iterations ahead, 101 KB; sm_90 834 instructions, 6 barriers) 65.8 / 43.8 / 62.1 /
41.8; the row max folded into the ring-slot barrier (each warp's maxima through shared
memory, 3 barriers per block instead of 5, 739 instructions) 63.3 / 41.1 (46.0 at 2 splits) /
60.5 / 39.9; both 67.1 / 44.3 / 64.1 / 43.0. Later run (the early-refill run above, us at
B=128 q1 / B=64 q2): the combine folded into the last split (atomic split counter reset by the
merging split, no combine launch) 59.4 / 58.3 with the late refill, 60.0 / 58.7 with the early
one; 4 splits instead of 2: 74.7 / 73.2 (late refill), 75.6 / 74.7 (early, folded combine).
Run of copy 4261 GB/s: the combine as a programmatic dependent launch (decode programs signal
``griddepcontrol.launch_dependents``, the combine waits with ``griddepcontrol.wait``; 256 / 512
values per combine program) 57.5 / 57.8 vs 57.6 at B=128 q1, 38.8 / 39.3 vs 38.5 at B=32 q2,
56.5 with gather first vs 56.8: within noise.
Run of copy 4252 GB/s (us at B=128 q1 / B=32 q2 / B=64 q2, default 56.6 / 37.5 / 54.8): the
split's top-k entries read into shared memory once (no global load in the loop; 760
instructions, 89.2 KB) 57.8 / 37.2 / 56.4; the ring wait as inline ``cp.async.wait_group``
(no CTA barrier after it, 4 per block; 750 instructions) 56.6 / 37.5 / 54.6; both 57.7 / 37.2
/ 56.2.
Session 18 (copy 4222 GB/s, us at B=128 q1 / B=32 q2 / B=64 q2): a lazy softmax rescale (the
reference max raised only when a block's max exceeds it by more than 8, log2 units; most
blocks skip the 64 multiplies of the two Oᵀ halves and the exp2 of alpha; common path ~733
instead of 787 instructions per block, GPU tests passed) 52.5 / 33.1 / 49.4 against 53.2 /
33.0 / 48.8 with the rescale of every block: within noise, removed. With every gathered row in
L2 the dual kernel takes 44.9 us at B=128 q1 against 50.8 from DRAM, and the same cp.async
gather alone streams at ~90% of copy (``benchmarks/probe_sparse_mla_small_h_parts.py``).
Session 19: an L2 prefetch (``prefetch.global.L2``, inline asm) of the rows of the block 1 / 2 /
4 blocks past each gather (825 instead of 787 instructions per block): 72.0 / 80.5 / 98.3 us at
B=128 q1, 51.3-68.6 against 33.3 at B=32 q2; removed. ncu source-level stall sampling (clocks
unlocked, B=128 q1): the worker warpgroup idled 9.6% of all samples at the partitions' join while the
default one finished, whose chain had 831 long-scoreboard samples to the worker's 368, 319 of them at one
copy of the next block's softmax entries into their loop-carried registers, which waited for the
entries' load issued ~60 instructions earlier. Loading them after the softmax's last use of the current
ones lets the load write the carried registers itself (sm_90: first use ~550 instructions after the load
in both partitions): 53.3 / 32.8 / 49.0 us against 54.1 / 33.5 / 49.7 at B=128 q1 / B=32 q2 / B=64 q2,
bit-identical outputs (copy 4262 GB/s); the join idle fell to 7.5% of samples. Later calls timed the
same default case at 49.6-52.8 us within one interleaved run, so the gain is within this shape's
variance; the change stays for the stall it removes. Loading every entry of the prologue and first
iteration before the first wait, and the query after the first gathers: 49.6 / 53.0 / 52.6 / 49.9 /
50.0 us against 51.5-52.8 / 52.5 / 52.7 / 49.8 / 49.6 in four A/Bs at B=128 q1 (8-warp kernel at
H=32: 79.9 against 79.3), not kept. The chains' blocks split unevenly (1-3 blocks moved to the worker,
or 1-2 to the default warpgroup, against the idle ncu showed): every skew slower, B=128 q1 50.3-53.5
against 49.8-49.9 (B=32 q2 33.6-34.6 against 32.8-33.1). The gather's entries for the block after
next loaded at the top of the iteration, before the CTA barrier, so that they do not queue behind the
current gather's 18 cp.async (808 loop instructions, one spill in the loop): 51.3-51.4 / 33.6-33.7 /
50.5 us against 49.9-52.8 / 32.5-32.7 / 48.8, removed.
Session 21 (copy 4256 GB/s; probe in ``benchmarks/results/2026-11-30-h200-s21-probes.txt``): two
8-warp chains per SM instead of two one-warpgroup chains (the 8-warp kernel of
``decode_gluon_small_h.py``, 518 instead of 754 loop instructions per warp, at 2 programs per SM:
2 stages, a 128-register cap, 89 spill instructions, 50 in the loop; 2 splits and the combine):
86.2 us at B=128 q1 against this kernel's 49.9 (uncapped, 171 registers, 1 program per SM: 76.6);
B=32 q2 64.1 against 32.5, B=64 q2 87.4 against 48.5.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma_wait,
)

from mate._core.hopper import smem_for_programs
from mate.ops.sparse_mla.decode_gluon_small_h import (
    _first_block,
    _issue_pv,
    _issue_qk,
    _load_vt,
    _natural_rows,
    _online_softmax,
    _stage_p,
    _vt_operand,
    check_small_h_block,
    natural_layout,
)
from mate.ops.sparse_mla.gluon_common import (
    _gather_next,
    _signal_dependents,
    _store_result,
    launch_decode,
)

__all__ = ["sparse_mla_decode_small_h_wg_kernel", "sparse_mla_decode_gluon_small_h_wg", "WG_NUM_WARPS", "WG_PV_FP8"]

WG_BLOCK_N = 64
WG_NUM_WARPS = 4
# P·V on FP8 tensor cores (e4m3 Vᵀ as loaded, P as hi + lo e4m3 tiles) instead of fp16 with Vᵀ
# widened; H200, interleaved, us (fp16 -> e4m3): B=128 q1 H=16 49.8 -> 49.6 / 49.4 (52.5 -> 49.6 in
# a slower call), B=32 q2 32.9 -> 32.0 (32.5 -> 31.9), B=64 q2 48.3 -> 48.0 (47.9 -> 47.7).
WG_PV_FP8 = True
WG_SMEM_LIMIT = smem_for_programs(2)  # 113 KB: two programs share an SM
DUAL_WORKER_REGS = gl.constexpr(256)


@gluon.jit
def _wg_chain(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len, top_k, split_blocks,
              HAS_SEQ_LENS: gl.constexpr, STAGES: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
              D_V: gl.constexpr, D_R: gl.constexpr, PV_FP8: gl.constexpr):
    """One warpgroup's chain over split ``pid_s`` (``split_blocks`` blocks of 64 top-k slots)
    of query position ``bt``: returns the two unnormalised Oᵀ halves [256, BLOCK_H] (value
    rows permuted, see ``_perm_values``), the running max (log2 domain) and the row sums."""
    gl.static_assert(BLOCK_N == 64)
    gl.static_assert(D_V == 512)
    gl.static_assert((BLOCK_H == 16) or (BLOCK_H == 32))

    G_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])  # 4 rows per thread
    R_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 32 if PV_FP8 else 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4 if PV_FP8 else 2)
    # Vᵀ half loads on the ring tile [rows, 256 values]: registers = 8 contiguous values and
    # rows +1, +8, +16, +32; lanes = rows +2, +4, values +8, +16, +32; warps = values +64, +128
    # (fp16: rows +1 and +8 are the operand's k pairs and repeats; e4m3: its k quadruples, see
    # decode_gluon_small_h._vt_e4m3).
    VL_L: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 8], [0, 16], [0, 32]],
        warp_bases=[[0, 64], [0, 128]],
        block_bases=[],
        shape=[BLOCK_N, 256],
    )
    K_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    R_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    F16_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    (q_smem, qr_smem, k_ring, r_ring, p_smem, lo, hi, n_iter, idx_row, tok_g, tok_r, tok_s, m_i, l_acc, s_zero,
     offs_ns) = _first_block(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len,
                             top_k, split_blocks, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V, D_R, G_L, R_L, S_L,
                             K_SL, R_SL, F16_SL, PV_FP8)
    acc0 = gl.zeros([256, BLOCK_H], gl.float32, layout=O_L)
    acc1 = gl.zeros([256, BLOCK_H], gl.float32, layout=O_L)
    if not PV_FP8:
        vt0 = _load_vt(k_ring.index(0).slice(0, 256, dim=1), VL_L, A_L)
    for it in range(n_iter):
        if PV_FP8:  # e4m3 operands are not carried across iterations (one register per byte there)
            vt0 = _load_vt(k_ring.index(it % STAGES).slice(0, 256, dim=1), VL_L, A_L)
        raw1 = k_ring.index(it % STAGES).slice(256, 256, dim=1).load(VL_L)  # Vᵀ half 1 of block it, still e4m3
        fence_async_shared()  # P of block it (stored by every thread) read by the wgmma
        gl.thread_barrier()  # ... and every thread has read block it's slot: refill it now
        acc0 = _issue_pv(vt0, p_smem, it % 2, acc0, PV_FP8)
        tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, it + STAGES, hi, num_tokens, k_ring, r_ring, lo,
                                    STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
        async_copy.wait_group(STAGES - 1)  # block it + 1 landed (block it + STAGES may still fly)
        fence_async_shared()
        gl.thread_barrier()  # ... for every thread
        s = _issue_qk(k_ring, r_ring, (it + 1) % STAGES, q_smem, qr_smem, s_zero)
        vt1 = _vt_operand(raw1, A_L)
        acc1 = _issue_pv(vt1, p_smem, it % 2, acc1, PV_FP8)
        # Sᵀ of it + 1 and P·V half 0 done (P·V half 1: one wgmma group, two in FP8)
        s, acc0 = warpgroup_mma_wait(num_outstanding=2 if PV_FP8 else 1, deps=(s, acc0))
        p, alpha, m_i, l_acc = _online_softmax(s, tok_s, num_tokens, qk_scale_log2, m_i, l_acc)
        # the next block's entries are loaded after this block's last use of tok_s, so the load
        # writes the loop-carried registers itself (loaded before it, they went to other registers
        # and the default partition's copy into the carried ones waited for the load in the same
        # iteration: 13% of its stall samples)
        slots_next = lo + (it + 2) * BLOCK_N + offs_ns
        tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
        _stage_p(p_smem, (it + 1) % 2, p, PV_FP8)
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
        acc0 = acc0 * alpha_o
        acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1,))
        acc1 = acc1 * alpha_o
        # after P·V half 1: one Vᵀ half live
        if not PV_FP8:
            vt0 = _load_vt(k_ring.index((it + 1) % STAGES).slice(0, 256, dim=1), VL_L, A_L)

    async_copy.wait_group(0)
    gl.thread_barrier()
    return acc0, acc1, m_i, gl.sum(l_acc, 0)


@gluon.jit
def _store_halves(acc0, acc1, m_i, l_i, out_ptr, lse_ptr, po_ptr, plse_ptr, out_scale, H, bt, pid_s, num_splits,
                  SPLIT: gl.constexpr, BLOCK_H: gl.constexpr, D_V: gl.constexpr, PV_FP8: gl.constexpr):
    """``_store_result`` of both Oᵀ halves of ``_wg_chain`` (with FP8 P·V the accumulators hold
    2^8 O, see ``_stage_p``). The value rows are put back in order by a renaming
    (``_natural_rows``) and the registers reordered (``natural_layout``), so that each thread
    writes 8 consecutive values of a head with one 16-byte store instead of 8 two-byte stores at
    permuted addresses. (Going through shared memory instead, by a layout conversion or the dual
    kernel's merge buffers, made ptxas serialize every wgmma of the dual kernel.)"""
    L: gl.constexpr = natural_layout(256, BLOCK_H)
    acc0 = gl.convert_layout(_natural_rows(acc0), L)
    acc1 = gl.convert_layout(_natural_rows(acc1), L)
    d_o = gl.arange(0, 256, layout=gl.SliceLayout(1, L))
    offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, L))
    offs_hl = gl.arange(0, BLOCK_H, layout=m_i.type.layout)
    acc_scale: gl.constexpr = 256.0 if PV_FP8 else 1.0
    _store_result(acc0, m_i, l_i, offs_h[None, :], d_o[:, None], offs_hl, out_ptr, lse_ptr, po_ptr,
                  plse_ptr, out_scale, H, bt, pid_s, num_splits, 1, SPLIT, D_V, acc_scale)
    _store_result(acc1, m_i, l_i, offs_h[None, :], 256 + d_o[:, None], offs_hl, out_ptr, lse_ptr,
                  po_ptr, plse_ptr, out_scale, H, bt, pid_s, num_splits, 1, SPLIT, D_V, acc_scale)


@gluon.jit
def _dual_second(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len, top_k,
                 split_blocks, x0, x1, xm, xl, done, HAS_SEQ_LENS: gl.constexpr, STAGES: gl.constexpr,
                 BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                 PV_FP8: gl.constexpr):
    """Worker warpgroup of the dual kernel: chain 2 * pid_s + 1, its state handed over
    through shared memory (``done`` counts one arrival)."""
    acc0, acc1, m_i, l_i = _wg_chain(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, 2 * pid_s + 1, num_tokens,
                                     qk_scale_log2, H, q_len, top_k, split_blocks, HAS_SEQ_LENS, STAGES, BLOCK_H,
                                     BLOCK_N, D_V, D_R, PV_FP8)
    x0.store(acc0)
    x1.store(acc1)
    xm.store(m_i)
    xl.store(l_i)
    mbarrier.arrive(done, count=1)


@gluon.jit
def _dual_first(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, out_ptr, lse_ptr, po_ptr, plse_ptr, bt, pid_s, num_tokens,
                qk_scale_log2, out_scale, H, q_len, top_k, split_blocks, num_splits, x0, x1, xm, xl, done,
                SPLIT: gl.constexpr, HAS_SEQ_LENS: gl.constexpr, STAGES: gl.constexpr, BLOCK_H: gl.constexpr,
                BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr, PV_FP8: gl.constexpr):
    """Default warpgroup of the dual kernel: chain 2 * pid_s, then the merge of both chains
    (log2 domain) and the store."""
    acc0, acc1, m_i, l_i = _wg_chain(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, 2 * pid_s, num_tokens, qk_scale_log2,
                                     H, q_len, top_k, split_blocks, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V, D_R,
                                     PV_FP8)
    mbarrier.wait(done, 0)
    m_b = xm.load(m_i.type.layout)
    l_b = xl.load(m_i.type.layout)
    m_new = gl.maximum(m_i, m_b)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # both chains empty: weights 0, no NaN
    w_a = gl.exp2(m_i - m_use)
    w_b = gl.exp2(m_b - m_use)
    O_L: gl.constexpr = acc0.type.layout
    wa_o = gl.convert_layout(w_a, gl.SliceLayout(0, O_L))[None, :]
    wb_o = gl.convert_layout(w_b, gl.SliceLayout(0, O_L))[None, :]
    acc0 = acc0 * wa_o + x0.load(O_L) * wb_o
    acc1 = acc1 * wa_o + x1.load(O_L) * wb_o
    _store_halves(acc0, acc1, m_new, l_i * w_a + l_b * w_b, out_ptr, lse_ptr, po_ptr, plse_ptr, out_scale, H, bt,
                  pid_s, num_splits, SPLIT, BLOCK_H, D_V, PV_FP8)


@gluon.jit
def sparse_mla_decode_small_h_wg_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    seq_lens_ptr,
    out_ptr,
    lse_ptr,
    po_ptr,
    plse_ptr,
    num_tokens,
    qk_scale_log2,
    out_scale,
    H,
    q_len,
    top_k,
    split_blocks,
    num_splits,
    SPLIT: gl.constexpr,
    HAS_SEQ_LENS: gl.constexpr,
    STAGES: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    D_V: gl.constexpr,
    D_R: gl.constexpr,
    CHAINS: gl.constexpr = 1,
    PV_FP8: gl.constexpr = False,
    PDL: gl.constexpr = False,
):
    """One program (one warpgroup): ``BLOCK_H`` (16 or 32, >= H) heads of one query position
    over ``split_blocks`` blocks of 64 top-k slots; grid (splits, B * q_len). ``CHAINS`` 2: the
    dual kernel, two such warpgroups in one program (8 warps): split ``pid_s`` of the plan
    covers chains 2 * pid_s and 2 * pid_s + 1 of ``split_blocks`` blocks each, merged in shared
    memory, so a plan that needs two chains per query position runs no combine kernel."""
    pid_s = gl.program_id(0)
    bt = gl.program_id(1).to(gl.int64)
    _signal_dependents(bt, PDL)  # a split plan's combine may launch (PDL)
    if CHAINS == 1:
        acc0, acc1, m_i, l_i = _wg_chain(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2,
                                         H, q_len, top_k, split_blocks, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V,
                                         D_R, PV_FP8)
        _store_halves(acc0, acc1, m_i, l_i, out_ptr, lse_ptr, po_ptr, plse_ptr, out_scale, H, bt, pid_s, num_splits,
                      SPLIT, BLOCK_H, D_V, PV_FP8)
    else:
        gl.static_assert(CHAINS == 2)
        # wgmma-layout accumulators: 8-float vectors (4 at 16 columns) XORed with row % 4, so a
        # warp's 8-byte stores and loads of 8 rows are conflict-free (as groupwise_gluon_kint's red_buf)
        X_SL: gl.constexpr = gl.SwizzledSharedLayout(4 if BLOCK_H == 16 else 8, 1, 4, order=[1, 0])
        V_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        x0 = gl.allocate_shared_memory(gl.float32, [256, BLOCK_H], X_SL)
        x1 = gl.allocate_shared_memory(gl.float32, [256, BLOCK_H], X_SL)
        xm = gl.allocate_shared_memory(gl.float32, [BLOCK_H], V_SL)
        xl = gl.allocate_shared_memory(gl.float32, [BLOCK_H], V_SL)
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(done, count=1)
        gl.warp_specialize([
            (_dual_first, (q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, out_ptr, lse_ptr, po_ptr, plse_ptr, bt, pid_s,
                           num_tokens, qk_scale_log2, out_scale, H, q_len, top_k, split_blocks, num_splits, x0, x1, xm,
                           xl, done, SPLIT, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V, D_R, PV_FP8)),
            (_dual_second, (q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len,
                            top_k, split_blocks, x0, x1, xm, xl, done, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V,
                            D_R, PV_FP8)),
        ], [4], [DUAL_WORKER_REGS])


def sparse_mla_decode_gluon_small_h_wg(
    query: torch.Tensor,
    kv_rows: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    bmm1_scale: float,
    bmm2_scale: float,
    block_h: int,
    num_splits: int,
    split_blocks: int,
    num_stages: int = 2,
    chains: int = 1,
    pv_fp8: bool = WG_PV_FP8,
    pdl: bool = False,
) -> None:
    """Launches the one-warpgroup small-H decode (contract of
    ``sparse_mla_decode_gluon_small_h``; ``num_stages`` 2 or 3), or with ``chains`` 2 the dual
    kernel: ``num_splits`` programs per query position, each over two chains of
    ``split_blocks`` blocks. ``pv_fp8``: P·V on FP8 tensor cores (P as hi + lo e4m3 tiles),
    else in fp16 with Vᵀ widened. No allocation, no host sync."""
    check_small_h_block(query.shape[2], block_h)
    if num_stages not in (2, 3):
        raise ValueError(f"num_stages must be 2 or 3 for the one-warpgroup kernel, got {num_stages}")
    if chains == 2 and num_stages != 2:
        raise ValueError(f"the dual kernel needs num_stages 2 (two rings of 3 do not fit), got {num_stages}")
    launch_decode(sparse_mla_decode_small_h_wg_kernel, (), query, kv_rows, block_tables, seq_lens, out, lse, partial_o,
                  partial_lse, bmm1_scale, bmm2_scale, num_splits, split_blocks, (block_h, 8, 6, 64, True),
                  WG_NUM_WARPS, plain_split_blocks=chains * split_blocks, pdl=pdl, STAGES=num_stages, BLOCK_H=block_h,
                  BLOCK_N=WG_BLOCK_N, CHAINS=chains, PV_FP8=bool(pv_fp8))
