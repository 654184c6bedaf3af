"""Pieces shared by the two Gluon kernels of the FP8 sparse MLA decode on Hopper
(``decode_gluon.py``: 64 heads per program; ``decode_gluon_small_h.py``: H <= 32, Sᵀ = K·Qᵀ).

Kernel side: the query tile into shared memory, the top-k slots of one split, and the
``cp.async`` gather of top-k rows into the shared-memory ring (16-byte pieces of each
576-byte row; invalid slots masked, zero-filled and never read). Host side: the launch
(unaligned-cache fallback, kernel, split combine) and the self-check run in a child process.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy

from mate._core.launch import launcher
from mate.ops.sparse_mla.metadata import HEAD_DIM_ROPE, HEAD_DIM_V


@gluon.jit
def _signal_dependents(dep, PDL: gl.constexpr):
    """``griddepcontrol.launch_dependents`` when ``PDL`` (``dep``: any scalar of the program,
    the asm's operand): a dependent launched with PDL may start once every program has run it."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r", [dep.to(gl.int32)],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _load_query(q_ptr, bt, H, h0, BLOCK_H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                G_L: gl.constexpr, R_L: gl.constexpr, K_SL: gl.constexpr, R_SL: gl.constexpr):
    """Heads [h0, h0 + BLOCK_H) of query position ``bt`` (e4m3, padded heads read as 0) into
    two shared tiles (value and rotary parts) kept for the whole loop."""
    D_ROW: gl.constexpr = D_V + D_R
    offs_hg = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, G_L))
    q_rows = (bt * H + offs_hg.to(gl.int64)) * D_ROW
    offs_vg = gl.arange(0, D_V, layout=gl.SliceLayout(0, G_L))
    q_nope = gl.load(q_ptr + (q_rows[:, None] + offs_vg[None, :]), mask=(offs_hg < H)[:, None], other=0.0)
    offs_hr = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, R_L))
    qr_rows = (bt * H + offs_hr.to(gl.int64)) * D_ROW + D_V
    offs_r = gl.arange(0, D_R, layout=gl.SliceLayout(0, R_L))
    q_rope = gl.load(q_ptr + (qr_rows[:, None] + offs_r[None, :]), mask=(offs_hr < H)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, D_V], K_SL, q_nope)
    qr_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, D_R], R_SL, q_rope)
    return q_smem, qr_smem


@gluon.jit
def _split_slots(idx_ptr, seq_lens_ptr, bt, pid_s, q_len, top_k, split_blocks, HAS_SEQ_LENS: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Slots [lo, hi) of split ``pid_s``, cut at seq_lens[b] (blocks wholly past it are not
    visited), its number of blocks and the top-k row of query position ``bt``."""
    lo = pid_s * (split_blocks * BLOCK_N)
    hi = gl.minimum(lo + split_blocks * BLOCK_N, top_k)
    if HAS_SEQ_LENS:
        seq_len = gl.load(seq_lens_ptr + bt // q_len)
        seq_len = gl.minimum(gl.maximum(seq_len, 0), top_k)
        hi = gl.minimum(hi, seq_len)
    n_iter = gl.maximum(hi - lo + (BLOCK_N - 1), 0) // BLOCK_N
    return lo, hi, n_iter, idx_ptr + bt * top_k


@gluon.jit
def _gather_tokens(idx_row, start, hi, BLOCK_N: gl.constexpr, G_L: gl.constexpr, R_L: gl.constexpr):
    """The top-k entries of slots [start, start + BLOCK_N) in the two copy layouts (-1 for
    slots >= hi, which are never read)."""
    offs_n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, G_L))
    offs_nr = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, R_L))
    tok = gl.load(idx_row + offs_n, mask=offs_n < hi, other=-1)
    tok_r = gl.load(idx_row + offs_nr, mask=offs_nr < hi, other=-1)
    return tok, tok_r


@gluon.jit
def _issue_gather(kv_ptr, tok, tok_r, num_tokens, k_buf, r_buf,
                  D_V: gl.constexpr, D_R: gl.constexpr, G_L: gl.constexpr, R_L: gl.constexpr):
    """cp.async of the rows ``tok`` / ``tok_r`` (one block, in the two copy layouts) into one
    ring slot; invalid entries are masked (zero-filled, never read); commits one group."""
    D_ROW: gl.constexpr = D_V + D_R
    # value part [BLOCK_N, 512]
    valid = (tok >= 0) & (tok < num_tokens)
    row = gl.where(valid, tok, 0).to(gl.int64) * D_ROW
    offs_v = gl.arange(0, D_V, layout=gl.SliceLayout(0, G_L))
    async_copy.async_copy_global_to_shared(k_buf, kv_ptr + (row[:, None] + offs_v[None, :]), mask=valid[:, None])
    # rotary part [BLOCK_N, 64]
    valid_r = (tok_r >= 0) & (tok_r < num_tokens)
    row_r = gl.where(valid_r, tok_r, 0).to(gl.int64) * D_ROW + D_V
    offs_r = gl.arange(0, D_R, layout=gl.SliceLayout(0, R_L))
    async_copy.async_copy_global_to_shared(r_buf, kv_ptr + (row_r[:, None] + offs_r[None, :]),
                                           mask=valid_r[:, None])
    async_copy.commit_group()


@gluon.jit
def _gather_prologue(kv_ptr, idx_row, lo, hi, num_tokens, k_ring, r_ring, STAGES: gl.constexpr,
                     BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr, G_L: gl.constexpr,
                     R_L: gl.constexpr):
    """Issues the gathers of the first ``STAGES - 1`` blocks and returns the top-k entries of
    the next one: entries are loaded one step before they are used (the gather of block
    it + STAGES - 1 and the mask of block it), so their latency is off the critical path."""
    for j in gl.static_range(STAGES - 1):
        tok_g, tok_r = _gather_tokens(idx_row, lo + j * BLOCK_N, hi, BLOCK_N, G_L, R_L)
        _issue_gather(kv_ptr, tok_g, tok_r, num_tokens, k_ring.index(j), r_ring.index(j), D_V, D_R, G_L, R_L)
    return _gather_tokens(idx_row, lo + (STAGES - 1) * BLOCK_N, hi, BLOCK_N, G_L, R_L)


@gluon.jit
def _gather_next(kv_ptr, idx_row, tok_g, tok_r, block, hi, num_tokens, k_ring, r_ring, lo, STAGES: gl.constexpr,
                 BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr, G_L: gl.constexpr, R_L: gl.constexpr):
    """Issues the gather of block ``block`` (top-k entries ``tok_g`` / ``tok_r``, loaded a step
    before) into ring slot ``block % STAGES`` and returns the entries of block ``block + 1``."""
    _issue_gather(kv_ptr, tok_g, tok_r, num_tokens, k_ring.index(block % STAGES), r_ring.index(block % STAGES),
                  D_V, D_R, G_L, R_L)
    return _gather_tokens(idx_row, lo + (block + 1) * BLOCK_N, hi, BLOCK_N, G_L, R_L)


@gluon.jit
def _to_layout(x, L: gl.constexpr):
    """``x`` converted to layout ``L`` (None: unchanged)."""
    if L is None:
        return x
    else:
        return gl.convert_layout(x, L)


@gluon.jit
def _store_result(acc, m_i, l_i, h_o, d_o, h_l, out_ptr, lse_ptr, po_ptr, plse_ptr, out_scale, H, bt, pid_s,
                  num_splits, H_AXIS: gl.constexpr, SPLIT: gl.constexpr, D_V: gl.constexpr,
                  ACC_SCALE: gl.constexpr = 1.0, OUT_L: gl.constexpr = None):
    """Normalises the accumulator and writes it (bf16, or the split's partial rows) and the
    natural-log LSE (+inf for a head without a valid slot; -inf in a split's partial LSE).

    ``H_AXIS``: the accumulator dimension indexed by heads (0: [heads, 512], 1: [512,
    heads]); ``h_o`` / ``d_o``: head and value index of each accumulator element (tensors
    that broadcast to its shape); ``h_l``: the heads in the layout of ``m_i`` / ``l_i``;
    ``ACC_SCALE``: the accumulator holds ACC_SCALE O (a power of two: the FP8 P·V's 2^8), folded
    into the row sums it is divided by. ``OUT_L``: the layout the rounded output is converted to
    before its store (``h_o`` / ``d_o`` then in it), None: the accumulator's."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    if ACC_SCALE != 1.0:
        l_safe = l_safe * ACC_SCALE
    o = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1 - H_AXIS, acc.type.layout)), 1 - H_AXIS)
    h_mask_o = h_o < H
    if not SPLIT:
        o_idx = (bt * H + h_o.to(gl.int64)) * D_V + d_o
        gl.store(out_ptr + o_idx, _to_layout((o * out_scale).to(gl.bfloat16), OUT_L), mask=h_mask_o)
        gl.store(lse_ptr + bt * H + h_l, lse, mask=h_l < H)
    else:
        p_idx = ((bt * num_splits + pid_s) * H + h_o.to(gl.int64)) * D_V + d_o
        gl.store(po_ptr + p_idx, _to_layout(o.to(po_ptr.dtype.element_ty), OUT_L), mask=h_mask_o)
        pl_rows = (bt * num_splits + pid_s) * H + h_l.to(gl.int64)
        gl.store(plse_ptr + pl_rows, gl.where(empty, float("-inf"), lse), mask=h_l < H)


def launch_decode(kernel, head_tiles: tuple, query: torch.Tensor, kv_rows: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, partial_o: torch.Tensor,
                  partial_lse: torch.Tensor, bmm1_scale: float, bmm2_scale: float, num_splits: int,
                  split_blocks: int, plain_config: tuple, num_warps: int, plain_split_blocks: int | None = None,
                  pdl: bool = False, **constexprs) -> None:
    """Launches a Gluon decode ``kernel`` (the argument list both kernels share) on grid
    ``(*head_tiles, num_splits, B * q_len)``, then the combine kernel of a split plan (with
    ``pdl``, the plan's ``DecodeMetadata.pdl``, as a programmatic dependent of the decode);
    nothing for an empty batch.
    cp.async moves 16-byte pieces: a cache view that is not 16-byte aligned (rows are 576
    bytes, so only the base matters) takes ``sparse_mla_decode_triton`` with the same plan
    and ``plain_config`` = (block_h, num_warps, num_stages, block_n, transposed), each of its
    ``num_splits`` programs over ``plain_split_blocks`` (default ``split_blocks``) blocks."""
    from mate.ops.sparse_mla.decode import decode_kernel_args, kv_kernel_arg, launch_combine, sparse_mla_decode_triton

    B, q_len, H, _ = query.shape
    rows = B * q_len
    if rows == 0 or H == 0:
        return
    if kv_kernel_arg(kv_rows, query).data_ptr() % 16:
        block_h, warps, stages, block_n, transposed = plain_config
        sparse_mla_decode_triton(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse,
                                 bmm1_scale, bmm2_scale, block_h, num_splits, plain_split_blocks or split_blocks, warps,
                                 stages, block_n, transposed, 0, False)
        return
    split = num_splits > 1
    pdl = pdl and split
    launcher(kernel)[(*head_tiles, num_splits, rows)](
        *decode_kernel_args(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse, bmm1_scale,
                            bmm2_scale, split_blocks, num_splits),
        SPLIT=split,
        HAS_SEQ_LENS=seq_lens is not None,
        D_V=HEAD_DIM_V,
        D_R=HEAD_DIM_ROPE,
        PDL=pdl,
        num_warps=num_warps,
        **constexprs,
    )
    if split:
        launch_combine(partial_o, partial_lse, out, lse, bmm2_scale, H, num_splits, rows, pdl=pdl)


def self_check_problem(B: int, q_len: int, H: int, top_k: int, tokens: int = 4096):
    """A random decode problem on the CPU for the self-checks: query, cache [tokens / 64, 64,
    576], top-k entries with 10% -1 and 5% out of range, random seq_lens with the last one 0."""
    fp8 = torch.float8_e4m3fn
    q = torch.randn(B, q_len, H, 576).to(fp8)
    kv = torch.randn(tokens // 64, 64, 576).to(fp8)
    idx = torch.randint(0, tokens, (B, q_len, top_k), dtype=torch.int32)
    r = torch.rand(idx.shape)
    idx = torch.where(r < 0.1, -1, torch.where(r < 0.15, tokens + 7, idx))
    sl = torch.randint(1, top_k + 1, (B,), dtype=torch.int32)
    sl[-1] = 0
    return q, kv, idx, sl


def assert_matches_reference(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, kv: torch.Tensor,
                             idx: torch.Tensor, sl: torch.Tensor, scale: float, s2: float, what: str = "") -> None:
    """``out`` / ``lse`` (GPU) against ``sparse_mla_decode_reference`` of the CPU problem, with
    the GPU tolerances of tests/sparse_mla/test_decode.py (FP8 tensor-core accumulation)."""
    from mate.ops.sparse_mla.reference import sparse_mla_decode_reference
    from mate.testing import assert_close

    ro, rl = sparse_mla_decode_reference(q, kv, idx, sl, scale, s2)
    assert_close(out.cpu(), ro, atol=3e-3, rtol=3e-2, name=f"out{what}")
    assert_close(lse.cpu().view(rl.shape), rl, atol=1.5e-2, rtol=2e-3, name=f"lse{what}")


def probe_in_subprocess(module: str, label: str, timeout_s: float) -> str | None:
    """Runs ``python -m module`` (a kernel's self-check) in a child process, so that a kernel
    that faults cannot poison the caller's CUDA context; returns None when it passed, else
    the reason."""
    import subprocess
    import sys

    try:
        res = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"{label} self-check timed out after {timeout_s:.0f} s"
    if res.returncode == 0:
        return None
    return f"{label} self-check failed (exit {res.returncode}): {(res.stdout + res.stderr)[-600:]}"
