"""Gluon kernel of the FP8 sparse MLA decode for few heads (H <= 32) on Hopper (sm_90).

Plans run it for 17 <= H <= 32; for H <= 16 they run its one-warpgroup variant
(``decode_gluon_small_h2.py``, 2 programs per SM, selected by ``num_warps=4``), which this
module's launcher dispatches to.

At small H the decode is bound by the gathered bytes, and the 64-head kernel
(``decode_gluon.py``) pads the heads to the wgmma M of 64, which makes it compute-bound at
4x the needed work. This kernel puts the gathered rows on M instead (Sᵀ = K·Qᵀ, the
formulation of ``sparse_mla_decode_split_kernel_t``), so no tensor-core row is padding:

* 8 warps = 2 warpgroups, one program per (query position, split), ``BLOCK_H`` (16 or 32)
  heads. Rows arrive as in ``decode_gluon.py``: ``cp.async`` 16-byte pieces into a ring of
  ``STAGES`` shared buffers in the 128-byte swizzled wgmma layout (invalid slots masked,
  zero-filled, never read).
* Sᵀ [64 rows, BLOCK_H] = K·Qᵀ on FP8 tensor cores (QGMMA), both operands K-major from
  shared memory; each warpgroup computes half of the heads.
* Online softmax over the rows (axis 0): the running max is reduced every block, the sum
  is kept per element and reduced once at the end.
* Oᵀ [512, BLOCK_H] += Vᵀ·Pᵀ in fp16 (HGMMA), each warpgroup half of the 512 value rows;
  Pᵀ from a shared tile, Vᵀ from registers: each thread reads 8 contiguous values of each of
  its rows from the ring (vector loads), widens them e4m3 -> fp16 (exact) and the tensor is
  relabelled (reshape + permute, a register-only renaming) into the wgmma A-operand layout.
  This permutes the value dimension: output row m holds value ``_perm_values(m, 512)``, undone when O
  is written by a register renaming (``_natural_rows``, ``natural_layout``): each thread then
  stores 8 consecutive values of a head with one 16-byte store (session 24; the 2-byte stores at
  the permuted addresses took 8 us of 80 at B=128 q1 H=32: H200, interleaved, bit-identical, us:
  B=128 q1 H=32 79.9 -> 71.9, B=64 q2 80.0 -> 72.0, B=64 q1 (2 splits) 52.4 -> 43.5, B=32 q2
  52.0 -> 43.3, B=128 q1 H=24 76.9 -> 71.5). With ``V_EARLY`` the next block's Vᵀ is loaded
  into other registers while P·V runs (sm_90: 198 / 237 registers at 16 / 32 heads instead of
  173 / 209, no spills).

Measured and removed (H200, top-k 2048, interleaved, copy 4136 GB/s; us):
* V widened into an fp16 shared tile (MN-major A operand, 3 stages): 75.7 against 67.9.
* A "lean" schedule (2 CTA barriers per block instead of 7: row max exchanged once, gather
  issued after it; proxy-fence placement, Sᵀ one or two blocks ahead, Vᵀ early or not) lost
  everywhere: B=128 q1 H=16 66.6 (this kernel, 54.8% of copy) against 68.7-80.4, even with no
  fence at all (73.2); H=32 81.0 against 85.2-97.8; B=64 q1 H=16 (2 splits) 43.4 against 46.2-50.4.
* A gather-only probe (same cp.async pieces, 8 warps per row, B=128) reached 46.7 us = 77.5%
  of copy at 3 or 5 stages (TMA, one box per 576-byte row: 18.7%); session 18's probe of the
  same scheme (``benchmarks/probe_sparse_mla_small_h_parts.py``) streams at 39.4 us = 90%, and
  plain loads at 93%. Either way the kernel is bound by its per-block compute chain (~2.1 us
  per 64-row block), not by the gather, barriers or the fence.

The split over the top-k list and its combine kernel are those of ``decode.py`` (same
scratch buffers from the plan). Gluon does not run under the interpreter: the kernel is
checked against the reference by the GPU tests of ``tests/sparse_mla/test_decode_gluon_small_h.py``.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mate.ops.sparse_mla.gluon_common import (
    _gather_next,
    _gather_prologue,
    _load_query,
    _signal_dependents,
    _split_slots,
    _store_result,
    assert_matches_reference,
    launch_decode,
    self_check_problem,
)
from mate.ops.sparse_mla.gluon_common import probe_in_subprocess as _probe

__all__ = ["sparse_mla_decode_small_h_kernel", "sparse_mla_decode_gluon_small_h", "check_small_h_block",
           "SMALL_H_NUM_WARPS", "SMALL_H_V_EARLY", "SMALL_H_PV_FP8", "natural_layout"]

SMALL_H_BLOCK_N = 64  # gathered rows per step (the wgmma M of Sᵀ)
SMALL_H_NUM_WARPS = 8  # two warpgroups
# How plans (sparse_mla_fp8_decode) feed Vᵀ: from registers, the next block's loaded while
# P·V runs (H200, benchmarks/bench_sparse_mla_small_h.py, 5 stages: 1-1.5% faster than
# loading it after P·V at B=128 H=32, B=64 H=16 q1/q2; equal at B=128 H=16).
SMALL_H_V_EARLY = True
# P·V of the 8-warp kernel on FP8 tensor cores (as the one-warpgroup kernel's default; 132 / 197
# instead of 200 / 239 registers at 16 / 32 heads): H200, B=128 q1 H=32, interleaved, 78.4 us
# at 3 stages, 79.6 at 2, 81.0 at 5 against the fp16 default's 79.7 (one call): not adopted. At
# 16 heads it fits two programs per SM without spills (128 registers, 87 KB at 2 stages), which
# session 21's fp16 kernel could not: 61.1 us at B=128 q1 with 2 splits against the dual
# kernel's 48.4 (B=32 q2 39.4 vs 31.7, B=64 q2 61.6 vs 47.1).
SMALL_H_PV_FP8 = False


@gluon.jit
def _issue_qk(k_ring, r_ring, slot, q_smem, qr_smem, s_zero):
    """Sᵀ = K·Qᵀ (512 + 64) of ring ``slot`` on FP8 tensor cores, issued asynchronously."""
    s = warpgroup_mma(k_ring.index(slot), q_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(r_ring.index(slot), qr_smem.permute((1, 0)), s, is_async=True)


@gluon.jit
def _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_acc):
    """One block of the online softmax over axis 0 (log2 domain): masks invalid slots;
    returns P, the rescale factor of the previous blocks, the new running max and the
    per-element running sums (reduced over the rows only at the end)."""
    valid = (tok >= 0) & (tok < num_tokens)
    s = gl.where(valid[:, None], s * qk_scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 0))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # all-invalid so far: no NaN
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[None, :])
    l_acc = l_acc * alpha[None, :] + p
    return p, alpha, m_new, l_acc


@gluon.jit
def _stage_p(p_smem, buf, p, PV_FP8: gl.constexpr):
    """Stores P of one block as Pᵀ [heads, rows] (the K-major B operand of P·V) into buffer
    ``buf`` of ``p_smem``: fp16, or with ``PV_FP8`` in e4m3 as hi = e4m3(P * 2^8) (heads
    [0, BLOCK_H) of the buffer) and lo = e4m3(P * 2^8 - hi) (heads [BLOCK_H, 2 BLOCK_H)), whose
    sum carries P to ~2^-8 relative (the scale keeps small probabilities in e4m3's normal
    range); P·V then runs as two FP8 wgmmas on the same e4m3 Vᵀ and the accumulator is 2^8
    times O. (hi alone, one wgmma: 51.7-51.8 against 49.4-49.6 us at B=128 q1 H=16, faster at
    B=32 / 64 q2, but ~2^-4 relative error in P failed the adversarial check.)"""
    if PV_FP8:
        # rows -> k of the 8-bit P·V (``_vt_e4m3``):
        # k bits, high to low, rows +32 +16 +4 +2 +1 +8, so a thread's rows r and r + 8 are adjacent
        gl.static_assert(p.shape[0] == 64)
        BLOCK_H: gl.constexpr = p.shape[1]
        p = gl.reshape(p, [2, 2, 2, 2, 2, 2, BLOCK_H])
        p = gl.permute(p, (0, 1, 3, 4, 5, 2, 6))
        p = gl.reshape(p, [64, BLOCK_H])
        ps = p * 256.0
        hi = ps.to(gl.float8e4nv)
        lo = (ps - hi.to(gl.float32)).to(gl.float8e4nv)
        # one store of both (two stores into one buffer made the compiler put a CTA barrier between them)
        p_smem.index(buf).store(gl.reshape(gl.permute(gl.join(hi, lo), (2, 1, 0)), [2 * BLOCK_H, 64]))
    else:
        p_smem.index(buf).store(gl.permute(p.to(gl.float16), (1, 0)))


@gluon.jit
def _transpose_bytes(a0, a1, a2, a3):
    """4x4 byte transposes of four e4m3 tensors (same layout, 4 consecutive register elements
    per 32-bit word): byte i of output j's word is byte j of input i's (8 PRMT per 4 words)."""
    return gl.inline_asm_elementwise(
        """{
        .reg .b32 t0, t1, t2, t3;
        prmt.b32 t0, $4, $5, 0x5140;
        prmt.b32 t1, $6, $7, 0x5140;
        prmt.b32 t2, $4, $5, 0x7362;
        prmt.b32 t3, $6, $7, 0x7362;
        prmt.b32 $0, t0, t1, 0x5410;
        prmt.b32 $1, t0, t1, 0x7632;
        prmt.b32 $2, t2, t3, 0x5410;
        prmt.b32 $3, t2, t3, 0x7632;
        }""",
        "=r,=r,=r,=r,r,r,r,r",
        [a0, a1, a2, a3],
        dtype=(gl.float8e4nv, gl.float8e4nv, gl.float8e4nv, gl.float8e4nv),
        is_pure=True,
        pack=4,
    )


@gluon.jit
def _vt_e4m3(v, A_L: gl.constexpr):
    """The e4m3 [64, N] values in layout ``VL_L`` (N = 256: a half of the one-warpgroup kernel;
    512: the 8-warp kernel) as the 8-bit A operand of Vᵀ [N, 64], not widened. A register of
    that operand holds 4 rows (k) of one value (m), so each 4 x 4 block of rows and values a
    thread loaded is byte-transposed; the rest is a renaming of registers. The operand's k
    order (k bits, high to low: rows +32 +16 +4 +2 +1 +8) puts a thread's rows r and r + 8 of Pᵀ
    side by side (``_stage_p``); its value rows are permuted as in ``_perm_values``."""
    N: gl.constexpr = v.shape[1]
    # rows r = 32 b5 + 16 b4 + 8 b3 + 4 b2 + 2 b1 + b0; word byte i = b3 + 2 b0
    v = gl.reshape(v, [2, 2, 2, 2, 2, 2, N])
    v = gl.permute(v, (0, 1, 3, 4, 6, 2, 5))  # [b5, b4, b2, b1, values, b3, b0]
    v_0, v_1 = gl.split(v)
    a0, a1 = gl.split(v_0)
    a2, a3 = gl.split(v_1)
    o0, o1, o2, o3 = _transpose_bytes(a0, a1, a2, a3)
    # o_j at value 4q + i holds row (b3, b0) = i, value 4q + j
    t = gl.join(gl.join(o0, o1), gl.join(o2, o3))  # [b5, b4, b2, b1, 4q + i, j0, j1]
    t = gl.reshape(t, [2, 2, 2, 2, N // 64, 8, 2, 2, 2, 2, 2])  # [b5 b4 b2 b1 | DH D543 d2 | b0 b3 | d0 d1]
    # m = D21 | DH | d0 | D543 (DH = D76 or D876), k = b5 b4 b2 b1 b0 b3
    t = gl.permute(t, (6, 10, 4, 9, 5, 0, 1, 2, 3, 7, 8))
    t = gl.reshape(t, [N, 64])
    return gl.convert_layout(t, A_L, assert_trivial=True)


@gluon.jit
def _issue_pv(vt, p_smem, buf, acc, PV_FP8: gl.constexpr):
    """Oᵀ (or an Oᵀ half) += Vᵀ·Pᵀ of P buffer ``buf`` (see ``_stage_p``), asynchronous: one
    fp16 wgmma group, or two FP8 ones (P's hi and lo tiles) on the same e4m3 Vᵀ."""
    if PV_FP8:
        BLOCK_H: gl.constexpr = acc.type.shape[1]
        acc = warpgroup_mma(vt, p_smem.index(buf).slice(0, BLOCK_H, dim=0).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(vt, p_smem.index(buf).slice(BLOCK_H, BLOCK_H, dim=0).permute((1, 0)), acc,
                            is_async=True)
    else:
        acc = warpgroup_mma(vt, p_smem.index(buf).permute((1, 0)), acc, is_async=True)
    return acc


def _perm_values(m, N: int):
    """Value index held by row ``m`` (ints or an integer tensor) of an Oᵀ of N = 512 value rows
    (the 8-warp kernel) or of an Oᵀ half of N = 256 (the one-warpgroup kernel, index within the
    half), as ``_vt_operand`` permutes them and ``_natural_rows`` undoes it before the store (the
    map, in plain Python, that the tests check both against). Bits of m, high to low: d2 d1 | DH
    | d0 | d5 d4 d3, DH = d8 d7 d6 (512) or d7 d6 (256)."""
    HB = 3 if N == 512 else 2  # bits of DH
    return ((m & 7) << 3) | ((m >> 3) & 1) | (((m >> 4) & (N // 64 - 1)) << 6) | (((m >> (4 + HB)) & 1) << 1) | (
        ((m >> (5 + HB)) & 1) << 2)


@triton.constexpr_function
def natural_layout(rows: int, block_h: int) -> gl.DistributedLinearLayout:
    """The layout of an Oᵀ after ``_natural_rows`` [rows values, block_h heads]: a half of the
    one-warpgroup kernel (256 rows, 4 warps) or the 8-warp kernel's whole Oᵀ (512 rows), with the
    wgmma accumulator's thread mapping and the registers reordered so that values +1, +2, +4 come
    first: registers = values +1, +2, +4 and heads +1, +8 (, +16); lanes = heads +2, +4 and
    values +8, +16, +32; warps = values +64, +128 (, +256). Each thread then holds 8 consecutive
    values of a head: one 16-byte store."""
    return gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8]] + ([[0, 16]] if block_h == 32 else []),
        lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
        warp_bases=[[64, 0], [128, 0]] + ([[256, 0]] if rows == 512 else []),
        block_bases=[],
        shape=[rows, block_h],
    )


@gluon.jit
def _natural_rows(acc):
    """An Oᵀ [N, heads] (N = 256 or 512) with its rows in value order: row m holds value
    ``_perm_values(m, N)`` (bits of m, high to low: d2 d1 | DH | d0 | d5 d4 d3); a reshape and
    permute, so no data moves."""
    N: gl.constexpr = acc.shape[0]
    BLOCK_H: gl.constexpr = acc.shape[1]
    acc = gl.reshape(acc, [2, 2, N // 64, 2, 8, BLOCK_H])  # [d2, d1, DH, d0, D543, h]
    acc = gl.permute(acc, (2, 4, 0, 1, 3, 5))  # [DH, D543, d2, d1, d0, h]
    return gl.reshape(acc, [N, BLOCK_H])


@gluon.jit
def _vt_operand(v, A_L: gl.constexpr):
    """The e4m3 [64, N] values in layout ``VL_L`` (N = 256: a half of the one-warpgroup kernel;
    512: the 8-warp kernel) as the A operand of Vᵀ [N, 64] in registers, value rows permuted
    (``_perm_values``): for an 8-bit ``A_L``
    kept e4m3 (``_vt_e4m3``), else widened to fp16 and renamed. Widening before the renaming:
    each F2FP gives a (d, d + 1) pair of one row and one PRMT per register pairs the rows
    (sm_90, one-warpgroup kernel: 746 instructions per block); renaming the e4m3 bytes first and
    widening in the operand layout compiled to 1097."""
    BLOCK_N: gl.constexpr = v.shape[0]
    N: gl.constexpr = v.shape[1]
    if A_L.k_width == 4:
        vt = _vt_e4m3(v, A_L)
    else:
        v = v.to(gl.float16)
        # d = DH | D543 | D21 | d0  ->  m = D21 | DH | d0 | D543 (DH = D76 or D876)
        v = gl.reshape(v, [BLOCK_N, N // 64, 8, 4, 2])
        v = gl.permute(v, (3, 1, 4, 2, 0))
        v = gl.reshape(v, [N, BLOCK_N])
        vt = gl.convert_layout(v, A_L, assert_trivial=True)
    return vt


@gluon.jit
def _load_vt(v_tile, VL_L: gl.constexpr, A_L: gl.constexpr):
    """Vᵀ of a ring tile's [64, N] values (a slot, or a half of one) as its A operand
    (``_vt_operand``): 8 contiguous bytes per row and thread."""
    return _vt_operand(v_tile.load(VL_L), A_L)


@gluon.jit
def _first_block(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len, top_k,
                 split_blocks, HAS_SEQ_LENS: gl.constexpr, STAGES: gl.constexpr, BLOCK_H: gl.constexpr,
                 BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr, G_L: gl.constexpr, R_L: gl.constexpr,
                 S_L: gl.constexpr, K_SL: gl.constexpr, R_SL: gl.constexpr, F16_SL: gl.constexpr,
                 PV_FP8: gl.constexpr = False):
    """Prologue of the small-H kernels: query and ring allocation, the split's slots, the
    gather of the first ``STAGES - 1`` blocks, then block 0 (its wait, the refill of the last
    slot, Sᵀ, the online softmax and Pᵀ stored to ``p_smem[0]``) and the tokens of block 1.
    The ring and ``p_smem`` (Pᵀ as [heads, rows], the K-major B operand, double-buffered so
    that a P·V of block it may still read it while the P of block it + 1 is written) are
    returned with the running state the main loop carries."""
    q_smem, qr_smem = _load_query(q_ptr, bt, H, 0, BLOCK_H, D_V, D_R, G_L, R_L, K_SL, R_SL)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D_V], K_SL)
    r_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D_R], R_SL)
    if PV_FP8:  # hi and lo tiles of each buffer (see _stage_p)
        P8_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
        p_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, 2 * BLOCK_H, BLOCK_N], P8_SL)
    else:
        p_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_H, BLOCK_N], F16_SL)

    lo, hi, n_iter, idx_row = _split_slots(idx_ptr, seq_lens_ptr, bt, pid_s, q_len, top_k, split_blocks,
                                           HAS_SEQ_LENS, BLOCK_N)
    tok_g, tok_r = _gather_prologue(kv_ptr, idx_row, lo, hi, num_tokens, k_ring, r_ring, STAGES, BLOCK_N, D_V, D_R,
                                    G_L, R_L)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
    l_acc = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_L)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_L)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_L))
    tok_s = gl.load(idx_row + lo + offs_ns, mask=lo + offs_ns < hi, other=-1)

    async_copy.wait_group(STAGES - 2)  # block 0 landed
    fence_async_shared()
    gl.thread_barrier()
    tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, STAGES - 1, hi, num_tokens, k_ring, r_ring, lo, STAGES,
                                BLOCK_N, D_V, D_R, G_L, R_L)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(_issue_qk(k_ring, r_ring, 0, q_smem, qr_smem, s_zero),))
    tok = tok_s
    slots_next = lo + BLOCK_N + offs_ns
    tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
    p, alpha, m_i, l_acc = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_acc)
    _stage_p(p_smem, 0, p, PV_FP8)
    return (q_smem, qr_smem, k_ring, r_ring, p_smem, lo, hi, n_iter, idx_row, tok_g, tok_r, tok_s, m_i, l_acc, s_zero,
            offs_ns)


@gluon.jit
def sparse_mla_decode_small_h_kernel(
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
    V_EARLY: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    D_V: gl.constexpr,
    D_R: gl.constexpr,
    PV_FP8: gl.constexpr = False,
    PDL: gl.constexpr = False,
):
    """One program: ``BLOCK_H`` (16 or 32, >= H) heads of one query position over
    ``split_blocks`` blocks of ``BLOCK_N`` (64) top-k slots; grid (splits, B * q_len).
    ``PV_FP8``: P·V on FP8 tensor cores (``_stage_p``, ``_vt_e4m3``; ``V_EARLY`` is then
    moot: Vᵀ of block it is read at the top of iteration it)."""
    gl.static_assert(BLOCK_N == 64)
    gl.static_assert(D_V == 512)
    gl.static_assert((BLOCK_H == 16) or (BLOCK_H == 32))

    # Copy layouts (8 warps): 16 contiguous bytes per thread.
    G_L: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [8, 1], [1, 0])
    R_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    # Sᵀ [64 rows, BLOCK_H]: each warpgroup half of the heads; k = 32 for FP8.
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_H // 2, 32])
    # Oᵀ [512, BLOCK_H]: warpgroup g owns value rows 64g + 128i (i < 4); k = 16 for fp16.
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                  instr_shape=[16, BLOCK_H, 32 if PV_FP8 else 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4 if PV_FP8 else 2)
    # Vᵀ loads, on the ring tile [rows, values]: registers = 8 contiguous values
    # (d0-d2) and the rows of the A operand's k pairs and repeats (+1, +8, +16, +32); lanes
    # = rows +2, +4 and values +8, +16, +32; warps = values +64, +128, +256. After the
    # renaming in _vt_operand this is the A operand layout up to the order of registers.
    VL_L: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 8], [0, 16], [0, 32]],
        warp_bases=[[0, 64], [0, 128], [0, 256]],
        block_bases=[],
        shape=[BLOCK_N, D_V],
    )
    K_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    R_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    F16_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_s = gl.program_id(0)
    bt = gl.program_id(1).to(gl.int64)  # query position b * q_len + t
    _signal_dependents(bt, PDL)  # a split plan's combine may launch (PDL)

    # Block 0: Sᵀ, softmax, P and Vᵀ staged. Then per iteration: Sᵀ of block it + 1 is
    # issued before Oᵀ += Vᵀ·Pᵀ of block it, so the softmax of it + 1 overlaps the P·V.
    (q_smem, qr_smem, k_ring, r_ring, p_smem, lo, hi, n_iter, idx_row, tok_g, tok_r, tok_s, m_i, l_acc, s_zero,
     offs_ns) = _first_block(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len,
                             top_k, split_blocks, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V, D_R, G_L, R_L, S_L,
                             K_SL, R_SL, F16_SL, PV_FP8)
    acc = gl.zeros([D_V, BLOCK_H], gl.float32, layout=O_L)
    if not PV_FP8:
        vt = _load_vt(k_ring.index(0), VL_L, A_L)
    for it in range(n_iter):
        if PV_FP8:  # e4m3 operands are not carried across iterations (one register per byte there)
            vt = _load_vt(k_ring.index(it % STAGES), VL_L, A_L)
        # block it + 1 landed; P (and V) of block it staged; every thread is done with
        # block it's ring slot, refilled next
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        gl.thread_barrier()
        tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, it + STAGES, hi, num_tokens, k_ring, r_ring, lo,
                                    STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
        nxt = (it + 1) % STAGES
        s = _issue_qk(k_ring, r_ring, nxt, q_smem, qr_smem, s_zero)
        acc = _issue_pv(vt, p_smem, it % 2, acc, PV_FP8)
        if V_EARLY and not PV_FP8:  # Vᵀ of block it + 1 into other registers while the wgmmas run
            vt_next = _load_vt(k_ring.index(nxt), VL_L, A_L)
        s = warpgroup_mma_wait(num_outstanding=2 if PV_FP8 else 1, deps=(s,))  # Sᵀ of block it + 1 done
        tok = tok_s
        slots_next = lo + (it + 2) * BLOCK_N + offs_ns
        tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
        # (past the last block every slot is masked: p = 0, alpha = 1 or, for a head
        # without any valid slot so far, 0 on a zero accumulator)
        p, alpha, m_i, l_acc = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_acc)
        _stage_p(p_smem, (it + 1) % 2, p, PV_FP8)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))  # P·V of block it done
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
        if not PV_FP8:
            if V_EARLY:
                vt = vt_next
            else:
                vt = _load_vt(k_ring.index(nxt), VL_L, A_L)

    async_copy.wait_group(0)
    gl.thread_barrier()
    # value rows back in order, 8 consecutive values of a head per thread: 16-byte stores
    OUT_L: gl.constexpr = natural_layout(D_V, BLOCK_H)
    acc = gl.convert_layout(_natural_rows(acc), OUT_L)
    offs_d = gl.arange(0, D_V, layout=gl.SliceLayout(1, OUT_L))
    offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, OUT_L))
    offs_hl = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, S_L))
    _store_result(acc, m_i, gl.sum(l_acc, 0), offs_h[None, :], offs_d[:, None], offs_hl, out_ptr, lse_ptr, po_ptr,
                  plse_ptr, out_scale, H, bt, pid_s, num_splits, 1, SPLIT, D_V,
                  256.0 if PV_FP8 else 1.0)  # FP8 P·V: the accumulator holds 2^8 O (see _stage_p)


def check_small_h_block(H: int, block_h: int) -> None:
    """Raises ValueError unless ``block_h`` (the heads of a small-H program) is 16 or 32 and
    covers the ``H`` query heads."""
    if block_h < H or block_h not in (16, 32):
        raise ValueError(f"the small-H Gluon kernel needs block_h 16 or 32 and H <= block_h, got H={H}, "
                         f"block_h={block_h}")


def sparse_mla_decode_gluon_small_h(
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
    num_stages: int,
    v_early: bool = SMALL_H_V_EARLY,
    num_warps: int = SMALL_H_NUM_WARPS,
    chains: int = 1,
    pv_fp8: bool | None = None,
    pdl: bool = False,
) -> None:
    """Launches the small-H Gluon decode on validated CUDA tensors (contract of
    ``sparse_mla_decode_gluon``; ``block_h`` 16 or 32, >= H). A cache view that is not
    16-byte aligned (cp.async) takes the plain kernels with the same plan (which read such a
    view with the heads-on-M kernel, see ``sparse_mla_decode_triton``).
    ``num_warps``: 8 for this kernel, 4 for the one-warpgroup kernel of
    ``decode_gluon_small_h2.py`` (the plan's choice for H <= 16), which with ``chains`` 2 runs
    as its dual kernel (two chains of ``split_blocks`` blocks per program). ``v_early`` (8
    warps): Vᵀ of the next block is loaded while the current P·V runs. ``pv_fp8``: P·V on FP8
    tensor cores (``_stage_p``); None: each kernel's default (the one-warpgroup kernel's
    ``WG_PV_FP8``, the 8-warp kernel's ``SMALL_H_PV_FP8``). ``pdl``: a split plan's combine
    as a programmatic dependent (``DecodeMetadata.pdl``). No allocation, no host sync."""
    check_small_h_block(query.shape[2], block_h)
    if num_warps not in (4, SMALL_H_NUM_WARPS):
        raise ValueError(f"num_warps must be 4 or {SMALL_H_NUM_WARPS} for the small-H Gluon kernel, got {num_warps}")
    if chains not in (1, 2) or (chains == 2 and num_warps != 4):
        raise ValueError(f"chains must be 1, or 2 with num_warps 4, got chains={chains}, num_warps={num_warps}")
    if num_warps == 4:
        from mate.ops.sparse_mla.decode_gluon_small_h2 import sparse_mla_decode_gluon_small_h_wg

        sparse_mla_decode_gluon_small_h_wg(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse,
                                           bmm1_scale, bmm2_scale, block_h, num_splits, split_blocks, num_stages,
                                           chains=chains, pdl=pdl,
                                           **({} if pv_fp8 is None else {"pv_fp8": pv_fp8}))
        return
    launch_decode(sparse_mla_decode_small_h_kernel, (), query, kv_rows, block_tables, seq_lens, out, lse, partial_o,
                  partial_lse, bmm1_scale, bmm2_scale, num_splits, split_blocks, (block_h, 8, 6, 64, True),
                  SMALL_H_NUM_WARPS, pdl=pdl, STAGES=num_stages, V_EARLY=v_early, BLOCK_H=block_h,
                  BLOCK_N=SMALL_H_BLOCK_N, PV_FP8=SMALL_H_PV_FP8 if pv_fp8 is None else bool(pv_fp8))


def _self_check() -> None:
    """Decodes small random problems (16 / 32 / 20 heads, split and unsplit plans, the 8-warp
    kernel with Vᵀ loaded early or after P·V, the one-warpgroup kernel and its dual kernel,
    invalid slots, an empty row) with the small-H Gluon kernels on the current GPU against the reference; raises
    on a mismatch. Run in a child process by :func:`probe_in_subprocess`."""
    from mate.ops.sparse_mla.metadata import plan_decode

    scale = 576**-0.5
    for B, q_len, H, top_k, splits, early, warps, chains in (
            (3, 2, 16, 2112, None, False, 8, 1), (2, 1, 32, 2048, 1, False, 8, 1), (2, 1, 20, 2048, 3, False, 8, 1),
            (3, 1, 16, 2048, 1, True, 8, 1), (2, 2, 32, 2048, 3, True, 8, 1), (3, 2, 16, 2112, None, True, None, 1),
            (2, 1, 12, 2048, 1, True, None, 1), (3, 2, 16, 2112, None, True, None, 2), (2, 1, 12, 2048, 1, True, None, 2)):
        q, kv, idx, sl = self_check_problem(B, q_len, H, top_k)
        md = plan_decode(B, q_len, H, top_k, "cuda", gluon=True, transposed=True, num_splits=splits, num_warps=warps,
                         chains=chains)
        assert md.gluon and md.transposed and md.num_warps == (warps or 4) and md.chains == chains
        out = torch.full((B, q_len, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((B * q_len * H,), float("nan"), device="cuda")
        sparse_mla_decode_gluon_small_h(q.cuda(), kv.cuda().view(-1, 576), idx.cuda(), sl.cuda(), out, lse,
                                        md.partial_o, md.partial_lse, scale, 1.25, md.block_h, md.num_splits,
                                        md.split_blocks, md.num_stages, v_early=early, num_warps=md.num_warps,
                                        chains=md.chains)
        torch.cuda.synchronize()
        assert_matches_reference(out, lse, q, kv, idx, sl, scale, 1.25,
                                 f" (H={H}, {md.num_warps} warps, early {early}, {chains} chains)")


def probe_in_subprocess(timeout_s: float = 240.0) -> str | None:
    """Runs :func:`_self_check` in a child process (``python -m
    mate.ops.sparse_mla.decode_gluon_small_h``), so that a kernel that faults cannot poison
    the caller's CUDA context; returns None when it passed, else the reason."""
    return _probe("mate.ops.sparse_mla.decode_gluon_small_h", "small-H Gluon decode", timeout_s)


if __name__ == "__main__":
    _self_check()
    print("small-H Gluon sparse MLA decode self-check passed")
