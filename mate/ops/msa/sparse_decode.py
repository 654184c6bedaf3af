"""MSA sparse decode, transposed: keys on the wgmma M side, the query heads of a KV head on N.

One program handles one query token, one KV head and one split of the token's block list,
which it builds itself (:func:`token_block_list`: the entries ``_msa_union_kernel`` writes for a
one-token tile, in the same order; no pre-kernel launch). Per selected 128-key
block it computes Sᵀ = K·Qᵀ ([128 keys, GP heads]) straight from the TMA-loaded K tile in
shared memory: Hopper wgmma with the keys on M, so no M rows are padding (the heads-on-M
kernel pads 16 heads to a 16-row ``mma.sync`` tile, and for fp8 widens K and V to fp16 per
element); with e4m3 q and K it is an fp8 QGMMA (exact products, fp32 accumulation). The
online softmax runs over the keys (axis 0) in the exp2 domain with ``k_scale`` folded into
the scale; Oᵀ [128 d, GP] += Vᵀ·Pᵀ with P in fp16 (bf16 for bf16 inputs, as the heads-on-M
kernel) and, for e4m3, Vᵀ in fp16 made on the tensor cores: V is read as two 64-column boxes and
each half transposed as eye · Vᵀ, an fp8 wgmma whose operands are K-major as stored, accumulated in
fp16 (one nonzero product per entry: exact), instead of a byte gather and widening in registers. ``v_scale`` multiplies the output, the
LSE is natural-log. Without a split it writes out / lse; with one the partial results go to
the fp32 scratch that ``_msa_combine_kernel`` merges.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from mate._core.env import config_overrides
from mate._core.hopper import REGS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_PROGRAM
from mate._core.triton_helpers import INTERPRET, dot_operand, finish_softmax, next_power_of_2, to_out_dtype
from mate.ops.msa.softmax_helpers import split_entries, token_position, visible_limit

__all__ = ["DECODE_VARIANT", "msa_decode_t_kernel", "decode_t_heads", "t_config", "t_constexprs",
           "t_programs_per_sm", "token_block_list", "publish_entries", "next_list_entry", "flat_tile_origin", "load_kv_tile",
           "load_kv_tile_halves", "identity_transpose", "lazy_softmax_step"]

DECODE_VARIANT = {"kernel": "transposed", "keys": 64, "stages": 3, "maxnreg": None, "lazy": 8,
                  "fp8_keys": 64, "fp8_stages": 3, "fp8_maxnreg": 128, "fp8_lazy": 8, "fp8_v": "mma"}
"""Decode kernel of ``sparse_attention`` (module defaults; the benchmark times the others).

``kernel``: "heads" (``_msa_sparse_fwd_kernel`` with one-token 16-row tiles after
``_msa_union_kernel``) or "transposed" (:func:`msa_decode_t_kernel`). For the transposed kernel,
``keys`` / ``stages`` / ``maxnreg`` (16-bit caches) and the ``fp8_`` ones: keys per TMA tile
(64: each selected block read as two halves), pipelining stages and a register cap; ``lazy``
(0: off) keeps the softmax's reference max until a logit exceeds it by more than ``lazy``
(log2 units) and sums the probabilities per key until the loop ends, so a tile without a
new maximum has no cross-warp max or sum and no rescale (the ``LAZY`` kernel argument; 8 by
default, 0 keeps the rescale of every tile). ``fp8_v``: how e4m3 V becomes the fp16 Vᵀ operand
of P·V, "mma" (the identity wgmma, the ``V_MMA`` kernel argument) or "gather" (byte loads from
shared memory widened in registers); the two give bit-identical outputs. H200, session 30
(``probe_msa_decode_floor --set hnd``, two processes, copy 4263 GB/s, us, mma / gather): NHD
75.6 / 76.5 and 76.4 / 76.7, HND 73.0 / 72.9 and 72.4 / 72.9; with the data in L2 44.5-44.7
against 52.9-53.3 (the SM's work per tile down by a sixth, the DRAM-bound time by under 1%).
mma: 127 registers uncapped, 52 KB of shared memory (4 programs per SM), 389-395 loop
instructions against 471. fp8 is
capped at 128 registers: uncapped the 64-key 3-stage compile takes 153 (3 programs per SM,
two waves for ``bench_msa_attention``'s 512 programs; the cause of the first in-kernel list's
108.5 against 80.1 us); 128 had no spills before the lazy rescale (now 2 spill instructions,
outside the key loop), 112 and 96 spill (19 / 52 spill instructions), and 128-key tiles spill
under it (212; uncapped 224 registers).

H200, lazy (``bench_msa_fp8_decode_variants --sel 16`` = ``bench_msa_attention``'s decode
inputs: B=128, q_len 1, 64K, M3 geometry, 16 blocks; interleaved, copy 4231 GB/s): fp8 lazy 8
85.1 us against 86.8 without (74.5 / 73.1% of copy; with a 96-register cap, 5 programs per SM
and 6 spills, 87.8, removed), fixed cost (all ids -1) 5.3 us; bf16 148.0 against 149.5.
Removed after the run of copy 4263 GB/s (bf16 4042): ``reg_list`` (the block list kept in
registers, each tile's page and block from a warp-local reduction, no global list load in
the loop): fp8 85.5 us against 84.3 (lazy 0: 87.1 against 85.6), fixed cost 5.5 both; bf16
148.9 against 148.0.
Earlier (2026-11-29, same inputs, copy 4115 GB/s, without lazy): fp8 80.2 us
(2 stages 92.0, 4 stages 98.5) against 84.8 with the ``_msa_union_kernel`` pre-kernel; bf16
139.6 against 145.9. Removed after that run: ``lsum`` (the softmax denominator as per-key
partial sums, reduced after the loop: fp8 86.7 us) and ``kvh_fast`` (KV head on the grid's
first axis: fp8 87.6, 113.5 with the pre-kernel; bf16 151.9), and the pre-kernel path.
Earlier (pre-kernel path): the "heads" kernel 161 us bf16, 124 fp8; for fp8 8 warps
per program 129.8 us against 81.8, 128-key tiles with 8 warps 86.5, the e4m3 V tile widened
through shared memory into a shared wgmma operand 108.7 (88.2 with 4D descriptors, 96.1 with
2 stages), a 96-register cap 82.1-82.6.

Environment: ``MATE_MSA_DECODE_VARIANT="fp8_stages=2,fp8_maxnreg=none"`` updates these keys at
import (benchmarks of the whole op; the module defaults stay as above).

Tried for fp8 in Gluon and removed (H200, same shape, 285 MB, interleaved replays; default 85.7 us,
80.5% of copy; bf16 161.8, 85.3%): d rows permuted so V is read with 32-bit shared loads into a
register fp16 wgmma operand (no byte gathers), a TMA ring, a one-barrier max exchange; 64-key tiles
87.5 us (3 stages) / 86.8 (2), 128-key 101.3 (3 splits); warp-specialized TMA producer 87.8 (3
stages) / 104.8 (4, split); Sᵀ(i + 1) issued before P·V(i) 90.3 (3) / 89.0 (2) / 104.6 (4, split).
The byte-gathered V was not the limit at this shape. A second Gluon kernel, a port of
:func:`msa_decode_t_kernel` (same list building, lazy rescale, 64-key tiles, 3 stages; 114
registers, no spills), timed 84.6 us against the Triton kernel's 84.8 (``--sel 16``, 268 MB,
copy 4262 GB/s; lazy 4: 84.8; 2 splits 95.5) and was removed: the two compile to the same speed.

What bounds fp8 (2026-11-30, ``benchmarks/probe_msa_decode_floor.py``, same inputs, 268 MB): on
the token-major cache a load-only kernel with this grid, block list and TMA pipeline streams at
88-90% of copy (70.9-71.3 us against the decode's 76.0-76.6), and 96% when the same bytes come
as aligned 256-byte pieces: a KV head's key row is a 128-byte piece here, which DRAM serves at
about the 90% target. Session 28 (``benchmarks/probe_msa_read_floor.py``) read exactly the
selected rows with plain vectorized loads under six schedules (a program per token and head,
per 4 blocks, per block with the hardware scheduling 8,192 programs, the 4 heads adjacent,
64- and 128-key loads): 74.4-78.7 us on the token-major cache (80.5-85.2% of copy, 4234 GB/s)
against 66.0 (96.0%) for the same bytes head-major; no read schedule reaches the 90% bar on
that layout. On a head-major copy the load-only floor is 95-96% (66.5 us) and the
decode 72.5-74.1: the rest is the loop's compute (56-58 us with the tiles in L2; 34 without
the V widening, 44 without the softmax). 128-key tiles without the cap (247 registers, 2
programs per SM): 75.2-75.5 against 73.2-74.1 head-major; the Gluon port restored for one call:
74.0 against 73.8 (L2 48.8 against 55.8). Not memory-level parallelism (session 19): the
pipeliner issues each tile's TMA loads at the end of the iteration two tiles earlier, but the
Gluon port refilling its slot right after Sᵀ (three tiles in flight) took 75.2 us head-major
against this kernel's 74.2, and an L2 prefetch of the lines 2-8 tiles ahead made every case
slower (80-111 us, the load-only floor 68.5 -> 81.8). The lazy step's "any logit above the
threshold" flag as one reduction over the flattened tile (REDUX.MAX.S32 and a cross-warp step; the
key loop 482 instead of 493 instructions, 16 instead of 23 SHFL; ncu had put ~10% of the stall samples
on the two-axis version's shuffle and VIMNMX chain): bit-identical, fp8 79.1 / 79.5 us head-major and
81.4 token-major against 80.0 / 79.8 and 81.7, bf16 129.2 / 129.1 against 130.2 / 129.7 (a slow
machine state: the head-major floor at 85% of copy). The d rows of Oᵀ permuted so that V is read
with 32-bit shared loads (as the Gluon port; 16 LDS instead of 64 LDS.U8, but 56 PRMT and 32 shifts
more, 510 loop instructions): bit-identical, 79.9 / 80.1 against 79.3 / 79.9 head-major, 81.5 against
82.0 token-major; not kept. Session 20 (Gluon, ``benchmarks/probe_msa_decode_smem_v.py`` of 6d1ad15,
removed after its run): V widened with 16-byte shared loads into an fp16 shared buffer and P·V as a
wgmma of two shared operands (left in flight across the next tile's Sᵀ; 2 stages so that 4 programs
fit, 128-register cap): 76.1 us against this kernel's 74.3 head-major, 77.7 against 76.7 token-major
(the restored register-V Gluon port 74.9 / 78.3), bit-identical. The register operand's byte
gathers and permutes are not what keeps the loop from the load-only floor. Session 23
(``benchmarks/probe_msa_decode_fp8_pv.py``): P·V on FP8 tensor cores in Gluon (Vᵀ kept e4m3 and
byte-transposed into the 8-bit register operand, P as hi + lo e4m3 tiles; ~300 instead of 482
instructions per tile) took the Triton kernel's time (80.9 / 77.1 us against 80.4 / 77.3 head- /
token-major). Its %globaltimer timeline shows programs with equal work ending between 46 and 68
us (their key loops 42-61 us, the load-only kernel alike): the SMs' shares of the memory system
differ, and work stealing between programs to even them out was slower (87.5 against 76.0 us,
``probe_msa_decode_steal.py`` in git history). Taking the list's count from its reduction and
the first entry from registers (no global round trip between the list and the first tile's
loads; key loop 517 instead of 482 instructions) did not move the time either: 81.5 against
81.2 / 81.3 us, fixed cost 5.7 against 5.6 (bf16 144.9 against 145.2 / 145.3). Session 26: the
ids loaded beside ``qo_indptr[B]`` and the page-table row prefetched into L1 (one global round
trip before the page lookups instead of three; 7b3abc8) timed within 0.4 us either way. Session 30
(``probe_msa_decode_floor --set hnd``, 268 MB, copy 4236-4238 GB/s): the token-major load floor
streamed at 91.8-92.6% that day and the decode at 86.0-86.6% (head-major 95.9-96.4 / 88.9-89.1%);
the loop with a fixed Pᵀ (V still gathered and widened, no P through shared memory) took the whole
loop's time (70.6-70.9 against 71.3 us head-major), the loop without the widening 67.2 (and 70.0 =
90.6% token-major): the cost over the floor is the V gather and widening of the register operand."""


def _env_overrides(text: str) -> dict:
    """``key=value,...`` -> DECODE_VARIANT updates (ints, ``none``, names)."""
    return config_overrides("MATE_MSA_DECODE_VARIANT", text, DECODE_VARIANT, allow_none=True)


DECODE_VARIANT.update(_env_overrides(os.environ.get("MATE_MSA_DECODE_VARIANT", "")))

T_COMPILES = {
    (False, 64, 2, False): (72, 71696), (False, 64, 3, False): (72, 104472), (False, 64, 4, False): (72, 137248),
    (False, 128, 2, False): (95, 139280), (False, 128, 3, False): (95, 204824),
    (True, 64, 2, False): (128, 28696), (True, 64, 3, False): (153, 45104), (True, 64, 4, False): (142, 61496),
    (True, 128, 2, False): (224, 55320), (True, 128, 3, False): (223, 88112),
    (True, 64, 2, True): (128, 36880), (True, 64, 3, True): (127, 53272), (True, 64, 4, True): (128, 69664),
    (True, 128, 2, True): (201, 71696), (True, 128, 3, True): (202, 104472),
}
"""(fp8, keys, stages, V_MMA): (registers, shared memory bytes) of the uncapped sm_90 compile of
the M3 tile (16 heads, 4 warps, unsplit, 16 ids, page table, token-major cache; bf16 and fp16
alike), read with cuobjdump: the 16-bit and the byte-gather fp8 entries before the lazy rescale
(the default now: bf16 64 keys 3 stages takes 87 registers; shared memory, which bounds bf16 at 2
programs per SM, is unchanged), the identity-wgmma fp8 entries (``V_MMA``, session 30) with it. No
spills; QGMMA and HGMMA in the SASS, no ptxas warning."""



def decode_t_heads(ratio: int) -> int:
    """Head columns of a program: the group padded to a power of two, at least 16 (wgmma N
    and ``tl.dot`` need 16)."""
    return max(16, next_power_of_2(ratio))


def t_config(is_fp8: bool) -> tuple[int, int, int | None]:
    """(keys per tile, stages, register cap) of the transposed kernel for this cache dtype."""
    pre = "fp8_" if is_fp8 else ""
    cap = DECODE_VARIANT[pre + "maxnreg"]
    return int(DECODE_VARIANT[pre + "keys"]), int(DECODE_VARIANT[pre + "stages"]), int(cap) if cap else None


def t_constexprs(is_fp8: bool, gp: int = 16) -> dict:
    """Kernel arguments of :data:`DECODE_VARIANT` beyond :func:`t_config` for this cache dtype
    and ``gp`` head columns (:func:`decode_t_heads`). ``V_MMA`` (the V descriptor's box is then
    half a row wide) only up to 16 columns: at 32 the sm_90 build under the 128-register cap
    spills 162 instructions against the gather's 63 (uncapped 204 registers against 175)."""
    return {"LAZY": int(DECODE_VARIANT[("fp8_" if is_fp8 else "") + "lazy"] or 0),
            "V_MMA": is_fp8 and DECODE_VARIANT["fp8_v"] == "mma" and gp <= 16}


def t_programs_per_sm(is_fp8: bool) -> int:
    """Programs of the transposed kernel resident on one SM (registers and shared memory of
    :data:`T_COMPILES`; an unlisted configuration is estimated), at most 5."""
    keys, stages, cap = t_config(is_fp8)
    tile = keys * 128 * (1 if is_fp8 else 2)
    regs, smem = T_COMPILES.get((is_fp8, keys, stages, t_constexprs(is_fp8)["V_MMA"]),
                                (128, 2 * tile * stages + 16384))
    if cap:
        regs = min(regs, cap)
    by_regs = REGS_PER_SM // (-(-regs // 8) * 8 * 128)
    by_smem = SMEM_PER_SM // (smem + SMEM_RESERVED_PER_PROGRAM)
    return max(1, min(5, by_regs, by_smem))


@triton.jit
def _request_blocks(req, ids, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, page_table_ptr, stride_pt, n_cols,
                    kv_indices_ptr, kv_page_indptr_ptr, n_indices, USE_PAGE_TABLE: tl.constexpr,
                    HAS_QO_OFFSET: tl.constexpr):
    """(first query row, query offset, KV length, pages of ``ids``, ids in the page list) of
    request ``req``; the page loads' masks only keep them in bounds."""
    q_start = tl.load(qo_indptr_ptr + req)
    kv_len = tl.load(kv_lens_ptr + req)
    if HAS_QO_OFFSET:
        q_off = tl.load(qo_offset_ptr + req)
    else:
        q_off = kv_len - (tl.load(qo_indptr_ptr + req + 1) - q_start)
    ok = ids >= 0
    if USE_PAGE_TABLE:
        ok = ok & (ids < n_cols)
        page = tl.load(page_table_ptr + req.to(tl.int64) * stride_pt + ids, mask=ok, other=0)
    else:
        pstart = tl.load(kv_page_indptr_ptr + req)
        pend = tl.load(kv_page_indptr_ptr + req + 1)
        # compared as differences: pstart + ids may exceed int32 for adversarial ids
        ok = ok & (pstart >= 0) & (ids < pend - pstart) & (ids < n_indices - pstart)
        page = tl.load(kv_indices_ptr + pstart + ids, mask=ok, other=0)
    return q_start, q_off, kv_len, page, ok


@triton.jit
def token_request(t, tvalid, ids, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter, page_table_ptr, stride_pt,
                  n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, USE_PAGE_TABLE: tl.constexpr,
                  HAS_QO_OFFSET: tl.constexpr, CAUSAL: tl.constexpr):
    """Token ``t``'s position and KV length (-1 and 0 unless ``tvalid``), the pages of its
    block ``ids`` and which of them are valid (in the request's pages, below its length,
    causally visible). Its request (the largest i < B with qo_indptr[i] <= t) is loaded for
    i = t (one query per request) while that guess is checked, else after a binary search.
    Layout-free (no tile shapes)."""
    g = tl.minimum(t, B - 1)
    q_start, q_off, kv_len, page, valid = _request_blocks(
        g, ids, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, page_table_ptr, stride_pt, n_cols, kv_indices_ptr,
        kv_page_indptr_ptr, n_indices, USE_PAGE_TABLE, HAS_QO_OFFSET)
    if (q_start > t) | ((tl.load(qo_indptr_ptr + g + 1) <= t) & (g < B - 1)):
        lo = g * 0
        hi = lo + B
        for _ in range(n_iter):
            mid = (lo + hi) // 2
            go = tl.load(qo_indptr_ptr + mid) <= t
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        q_start, q_off, kv_len, page, valid = _request_blocks(
            lo, ids, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, page_table_ptr, stride_pt, n_cols,
            kv_indices_ptr, kv_page_indptr_ptr, n_indices, USE_PAGE_TABLE, HAS_QO_OFFSET)
    pos, nblk = token_position(q_off, t, q_start, kv_len)
    pos = tl.where(tvalid, pos, -1)
    kv_len = tl.where(tvalid, kv_len, 0)
    valid = valid & (ids < nblk) & tvalid & (page >= 0) & (page < num_pages)
    if CAUSAL:
        valid = valid & (ids * 128 <= pos)
    return pos, kv_len, page, valid


@triton.jit
def token_block_list(
    t, kvh, split, ubase,
    idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
    page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, W,
    u_page_ptr, u_blk_ptr, cnt_ptr,
    BLOCK_W: tl.constexpr, NUM_SPLITS: tl.constexpr, CAUSAL: tl.constexpr, USE_PAGE_TABLE: tl.constexpr,
    HAS_QO_OFFSET: tl.constexpr,
):
    """``_msa_union_kernel`` for one token and KV head, inside the decode program: maps the
    token's block ids through its request's pages, drops -1, out-of-range and causally
    invisible ids, de-duplicates the (page, block) pairs (first occurrence kept, in list
    order) and writes this split's share of the kept entries to the union slots ``ubase + e``.
    Returns (position, KV length, kept count); an invalid token gets (-1, 0, 0). The count goes
    through ``cnt_ptr`` (the splits of a token and KV head store the same value there): read
    back from one address it is warp-uniform for ptxas, so the loop keeps its bounds, list
    addresses and TMA coordinates in uniform registers (sm_90 fp8: 468 instead of 439 loop
    instructions with the reduction's value, 29 R2UR; bf16 400 instead of 320)."""
    tvalid = t < tl.load(qo_indptr_ptr + B)
    w = tl.arange(0, BLOCK_W)
    ids = tl.load(idx_ptr + t.to(tl.int64) * stride_it + kvh * stride_ih + w, mask=tvalid & (w < W), other=-1)
    pos, kv_len, page, valid = token_request(
        t, tvalid, ids, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter, page_table_ptr, stride_pt, n_cols,
        kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, USE_PAGE_TABLE, HAS_QO_OFFSET, CAUSAL)
    # one request: equal ids have equal pages and validity, so (page, block) pairs are equal
    # where the ids are, and a valid id's earlier copies are valid
    dup = tl.max(((ids[:, None] == ids[None, :]) & (w[None, :] < w[:, None])).to(tl.int32), axis=1)
    first = valid & (dup == 0)
    slot = tl.cumsum(first.to(tl.int32), axis=0) - 1
    cnt = tl.sum(first.to(tl.int32), axis=0)
    return pos, kv_len, publish_entries(first, slot, cnt, page, ids, split, ubase, u_page_ptr, u_blk_ptr, cnt_ptr,
                                        NUM_SPLITS)


@triton.jit
def publish_entries(first, slot, cnt, page, ids, split, ubase, u_page_ptr, u_blk_ptr, cnt_ptr,
                    NUM_SPLITS: tl.constexpr):
    """The end of :func:`token_block_list`: writes this split's share of the kept entries
    (``first``: kept, ``slot``: their rank among the kept, ``cnt``: how many) to the union slots
    ``ubase + slot`` and returns the count read back from ``cnt_ptr`` after a CTA barrier, which
    also makes the entries visible to every thread. Layout-free (the Gluon probes call it)."""
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    mine = first & (slot >= e0) & (slot < e1)
    tl.store(u_page_ptr + ubase + slot, page, mask=mine)
    tl.store(u_blk_ptr + ubase + slot, ids, mask=mine)
    tl.store(cnt_ptr, cnt)
    tl.debug_barrier()  # the loop's threads read entries other threads wrote
    return tl.load(cnt_ptr)


@triton.jit
def next_list_entry(u_page_ptr, u_blk_ptr, ubase, it, e_last, KPB: tl.constexpr):
    """(page, block) of the list entry that holds key tile ``it + 1`` (``KPB`` tiles per entry),
    clamped to entry ``e_last``: the key loop loads each tile's entry one step ahead (which gives
    the pipeliner loop-carried TMA coordinates)."""
    e_n = tl.minimum((it + 1) // KPB, e_last)
    return tl.load(u_page_ptr + ubase + e_n), tl.load(u_blk_ptr + ubase + e_n)


@triton.jit
def flat_tile_origin(page, kvh, n_kvh, k0, HEAD_DIM: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    """(row, column) of the tile of KV head ``kvh``, keys from ``k0`` of ``page``, in the 2D view
    of a contiguous cache: [pages * Hkv * 128, D] head-major, [pages * 128, Hkv * D] token-major."""
    if HEAD_MAJOR:
        return (page * n_kvh + kvh) * 128 + k0, 0
    else:
        return page * 128 + k0, kvh * HEAD_DIM


@triton.jit
def load_kv_tile(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM: tl.constexpr, KEYS: tl.constexpr,
                 FLAT: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    """TMA loads of the K and V tiles [KEYS, HEAD_DIM] of KV head ``kvh``, keys ``k0`` ..
    ``k0 + KEYS - 1`` of ``page`` (``FLAT``: descriptors of 2D views of contiguous caches,
    rows of HEAD_DIM values; else 4D descriptors of the paged caches)."""
    if FLAT:
        row, col = flat_tile_origin(page, kvh, n_kvh, k0, HEAD_DIM, HEAD_MAJOR)
        kt = k_desc.load([row, col])
        vt = v_desc.load([row, col])
    elif HEAD_MAJOR:
        kt = tl.reshape(k_desc.load([page, kvh, k0, 0]), [KEYS, HEAD_DIM])
        vt = tl.reshape(v_desc.load([page, kvh, k0, 0]), [KEYS, HEAD_DIM])
    else:
        kt = tl.reshape(k_desc.load([page, k0, kvh, 0]), [KEYS, HEAD_DIM])
        vt = tl.reshape(v_desc.load([page, k0, kvh, 0]), [KEYS, HEAD_DIM])
    return kt, vt


@triton.jit
def load_kv_tile_halves(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM: tl.constexpr, KEYS: tl.constexpr,
                        FLAT: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    """:func:`load_kv_tile` with V as two column halves [KEYS, HEAD_DIM // 2] (``v_desc``'s box
    is half a row wide)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    if FLAT:
        row, col = flat_tile_origin(page, kvh, n_kvh, k0, HEAD_DIM, HEAD_MAJOR)
        kt = k_desc.load([row, col])
        v_lo = v_desc.load([row, col])
        v_hi = v_desc.load([row, col + HALF])
    elif HEAD_MAJOR:
        kt = tl.reshape(k_desc.load([page, kvh, k0, 0]), [KEYS, HEAD_DIM])
        v_lo = tl.reshape(v_desc.load([page, kvh, k0, 0]), [KEYS, HALF])
        v_hi = tl.reshape(v_desc.load([page, kvh, k0, HALF]), [KEYS, HALF])
    else:
        kt = tl.reshape(k_desc.load([page, k0, kvh, 0]), [KEYS, HEAD_DIM])
        v_lo = tl.reshape(v_desc.load([page, k0, kvh, 0]), [KEYS, HALF])
        v_hi = tl.reshape(v_desc.load([page, k0, kvh, HALF]), [KEYS, HALF])
    return kt, v_lo, v_hi


@triton.jit
def identity_transpose(eye, v):
    """vᵀ [D, KEYS] as fp16 from an e4m3 tile v [KEYS, D] with ``eye`` the e4m3 identity [D, D]:
    an fp8 wgmma whose operands are both K-major as stored (no byte gather), exact."""
    if INTERPRET:
        return tl.trans(v).to(tl.float16)
    else:
        return tl.dot(eye, tl.trans(v), out_dtype=tl.float16)


@triton.jit
def _pv_dot(vt, pv):
    """Oᵀ rows += Vᵀ · Pᵀ (16-bit operands; fp32 under the interpreter)."""
    if INTERPRET:
        return tl.dot(vt.to(tl.float32), pv.to(tl.float32))
    else:
        return tl.dot(vt, pv)


@triton.jit
def lazy_softmax_step(s, m_i, l_k, acc, LAZY: tl.constexpr):
    """One tile of the lazy online softmax over the keys (axis 0 of the masked logits ``s``
    [KEYS, GP], exp2 domain): P against the reference max ``m_i``, which is raised to the
    running max (rescaling the per-key sums ``l_k`` and ``acc``) only when a logit exceeds it
    by more than ``LAZY``. Returns (P, m_i, l_k, acc); the caller adds P to ``l_k``."""
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    x = s - m_use[None, :]
    p = tl.exp2(x)
    # the exponent itself is tested, not s > m_i + LAZY: that sum rounds for |m_i| >= 2^27
    # (to m_i + 16 at LAZY 8, so p = 2^16 would overflow fp16); -inf: any finite logit
    thr = tl.where(m_i == float("-inf"), float("-inf"), LAZY + 0.0)
    # one reduction over the flattened tile: a warp-wide REDUX instead of the two axes' shuffle trees
    hit = (x > thr[None, :]).to(tl.int32)
    grow = tl.max(tl.reshape(hit, [hit.numel], can_reorder=True), axis=0)
    if grow != 0:
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[None, :])
        alpha = tl.exp2(m_i - m_use)
        l_k = l_k * alpha[None, :]
        acc = acc * alpha[None, :]
        m_i = m_new
    return p, m_i, l_k, acc


@triton.jit
def msa_decode_t_kernel(
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
    HAS_QO_OFFSET: tl.constexpr = False, LAZY: tl.constexpr = 0, V_MMA: tl.constexpr = False,
):
    t = tl.program_id(0)  # grid (tokens, KV heads, splits)
    kvh = tl.program_id(1)
    n_kvh = tl.num_programs(1)
    split = tl.program_id(2)
    ubase = (t.to(tl.int64) * n_kvh + kvh) * C
    hl = tl.arange(0, GP)
    h = kvh * RATIO + hl
    hvalid = hl < RATIO
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, KEYS)
    # Qᵀ [D, GP], d contiguous per head column (K-major B operand, as fp8 wgmma requires)
    qt = tl.load(q_ptr + t.to(tl.int64) * stride_qt + h[None, :] * stride_qh + offs_d[:, None],
                 mask=hvalid[None, :], other=0.0)
    # q is loaded first: its latency overlaps the list's
    pos, kv_len, cnt = token_block_list(
        t, kvh, split, ubase, idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B,
        n_iter, page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages,
        W, u_page_ptr, u_blk_ptr, u_cnt_ptr + t * n_kvh + kvh, BLOCK_W, NUM_SPLITS, CAUSAL, USE_PAGE_TABLE,
        HAS_QO_OFFSET)
    qt = dot_operand(qt)
    limit = visible_limit(pos, kv_len, CAUSAL)
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    if LAZY > 0:  # per-key partial sums, reduced after the loop
        l_k = tl.zeros([KEYS, GP], dtype=tl.float32)
    # V_MMA (e4m3): Oᵀ in two row halves, rows 0 .. HALF - 1 in acc and the rest in acc_hi
    HALF: tl.constexpr = HEAD_DIM // 2
    acc = tl.zeros([HALF if V_MMA else HEAD_DIM, GP], dtype=tl.float32)
    if V_MMA:
        acc_hi = tl.zeros([HALF, GP], dtype=tl.float32)
        eye = tl.where(tl.arange(0, HALF)[:, None] == tl.arange(0, HALF)[None, :], 1.0, 0.0).to(q_ptr.dtype.element_ty)
    KPB: tl.constexpr = 128 // KEYS  # key sub-blocks per selected block
    # the next entry's page and block, loaded one step ahead: the TMA loads then depend on
    # loop-carried values, so the pipeliner gives them num_stages - 1 buffers (else 1)
    e_last = tl.maximum(e1 - 1, 0)
    page_n = tl.load(u_page_ptr + ubase + tl.minimum(e0, e_last))
    blk_n = tl.load(u_blk_ptr + ubase + tl.minimum(e0, e_last))
    for it in range(e0 * KPB, e1 * KPB):
        k0 = (it % KPB) * KEYS
        page = page_n
        blk = blk_n
        page_n, blk_n = next_list_entry(u_page_ptr, u_blk_ptr, ubase, it, e_last, KPB)
        if V_MMA:
            kt, v_lo, v_hi = load_kv_tile_halves(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT,
                                                 HEAD_MAJOR)
            # Vᵀ halves [HALF, KEYS] as eye · Vᵀ on the tensor cores (one nonzero product per
            # entry, accumulated in fp16: exact for e4m3), issued before Sᵀ
            vt_lo, vt_hi = identity_transpose(eye, v_lo), identity_transpose(eye, v_hi)
        else:
            kt, vt = load_kv_tile(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT, HEAD_MAJOR)
            if IS_FP8:
                vt = vt.to(tl.float16)  # exact for e4m3
            vt_lo = tl.trans(vt)
        s = tl.dot(dot_operand(kt), qt) * qk_scale  # Sᵀ [KEYS, GP]
        kpos = blk * 128 + k0 + offs_n
        s = tl.where((kpos <= limit)[:, None], s, float("-inf"))
        if LAZY > 0:
            # m_i is only a reference point, raised to the running max when a logit exceeds it
            # by more than LAZY (log2 units, so p <= 2^LAZY): no cross-warp max, sum or
            # rescale in the common tile
            m_old = m_i
            p, m_i, l_k, acc = lazy_softmax_step(s, m_i, l_k, acc, LAZY)
            l_k += p
            pv = to_out_dtype(p, vt_lo.dtype)
            acc += _pv_dot(vt_lo, pv)
            if V_MMA:  # the rescale lazy_softmax_step gave acc (1 where m_i did not move)
                acc_hi = acc_hi * tl.where(m_i == m_old, 1.0, tl.exp2(m_old - m_i))[None, :]
                acc_hi += _pv_dot(vt_hi, pv)
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_use[None, :])
            alpha = tl.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            pv = to_out_dtype(p, vt_lo.dtype)
            acc = acc * alpha[None, :] + _pv_dot(vt_lo, pv)
            if V_MMA:
                acc_hi = acc_hi * alpha[None, :] + _pv_dot(vt_hi, pv)
            m_i = m_new
    if LAZY > 0:
        l_i = tl.sum(l_k, axis=0)
    l_safe, lse = finish_softmax(m_i, l_i)
    rows = tl.arange(0, HALF if V_MMA else HEAD_DIM)  # Oᵀ rows (d) of acc
    if NUM_SPLITS == 1:
        o_row = o_ptr + t.to(tl.int64) * stride_ot + h[None, :] * stride_oh
        tl.store(o_row + rows[:, None], to_out_dtype(acc / l_safe[None, :] * v_scale, o_ptr.dtype.element_ty),
                 mask=hvalid[None, :])
        if V_MMA:
            tl.store(o_row + HALF + rows[:, None],
                     to_out_dtype(acc_hi / l_safe[None, :] * v_scale, o_ptr.dtype.element_ty), mask=hvalid[None, :])
        tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=hvalid)
    else:
        prow = (split.to(tl.int64) * total_q + t) * HQ + h
        tl.store(op_ptr + prow[None, :] * HEAD_DIM + rows[:, None], acc / l_safe[None, :], mask=hvalid[None, :])
        if V_MMA:
            tl.store(op_ptr + prow[None, :] * HEAD_DIM + HALF + rows[:, None], acc_hi / l_safe[None, :],
                     mask=hvalid[None, :])
        tl.store(lp_ptr + prow, lse, mask=hvalid)
