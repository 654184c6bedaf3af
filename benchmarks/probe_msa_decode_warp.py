"""Probe (not yet timed): the MSA decode with per-warp key slices, written in plain Triton.

Session 31 left one design untried for the fp8 decode's per-tile work: each warp owns a slice
of a tile's keys, keeps its own softmax state, feeds its P straight from the S accumulator
into P·V, and the warps' partial outputs merge once at the end, so a tile needs no
cross-warp max, flag exchange or P round trip through shared memory. Session 32 found that
Triton 3.6 expresses it as batched dots whose batch axis is the warp (``warpsPerCTA = [4, 1,
1]``): S [warps, heads, keys/warps] = Q · K_wᵀ and O_w [warps, heads, D] += P_w · V_w, both
``mma.sync`` (on sm_90 e4m3 operands become fp16 HMMA with ``cvt`` per element, checked by
compiling on the CPU).

:func:`msa_decode_warp_kernel` takes :func:`mate.ops.msa.sparse_decode.msa_decode_t_kernel`'s
arguments (the launcher's), builds the token's block list the same way and loads the same
TMA tiles (``V_MMA`` off: run with ``MATE_MSA_DECODE_VARIANT=fp8_v=gather``). The softmax
is the plain online one per warp (no lazy rescale: a per-warp branch does not exist in
Triton). ``python benchmarks/probe_msa_decode_warp.py check`` compares it with the reference
under the interpreter (CPU); ``compile`` builds it for sm_90 and prints registers, spills and
the key loop's instruction mix. Timing it on the H200 against the default kernel (the bar
shape of ``bench_msa_attention``) is for a session with device time.

Session 32, sm_90 build on the CPU (16 heads, 64-key tiles, 3 stages, token-major): fp8 takes
168 registers (3 programs per SM; under a 128 cap, 33 spill instructions) and a key loop of
451 instructions: 32 ``HMMA.16816``, 64 ``F2FP.F16.E4M3.UNPACK_B`` (K and V widened per
element: Triton's mma.sync path has no fp8 operands on sm_90), 3 CTA barriers (the pipeline's).
The default kernel's loop: 395 instructions at 124 registers (4 programs per SM). bf16: 179
registers, a 296-instruction loop. So in plain Triton the design trades the warpgroup's
barriers and P round trip for per-element widening and a 64-register accumulator per warp;
it would pay only with fp8 ``mma.sync`` operands (inline PTX) and fewer registers.

Session 34 (``python benchmarks/probe_msa_decode_warp.py ptx``, no GPU): inline PTX would not
help either, because sm_90 has no fp8 ``mma.sync``. ptxas (Triton's 12.8 and CUDA 13.0's
alike) lowers one ``mma.sync.m16n8k32.e4m3.e4m3.f32`` for sm_90a to 12 ``F2FP.F16.E4M3.UNPACK_B``
and 2 ``HMMA.16816.F32``: the widening and fp16 products Triton's build already has, while
for sm_89 it is one native ``QMMA.16832``. Hopper's fp8 tensor-core path is wgmma only, so the
per-warp design cannot drop the widening on the H200, and it stays untimed.
"""

from __future__ import annotations

import re
import sys

import triton
import triton.language as tl

from mate._core.triton_helpers import INTERPRET, finish_softmax, to_out_dtype
from mate.ops.msa.softmax_helpers import split_entries, visible_limit
from mate.ops.msa.sparse_decode import load_kv_tile, next_list_entry, token_block_list


@triton.jit
def _warp_dot(a, b, OP_DTYPE: tl.constexpr):
    """Batched a · b in 16-bit operands (fp32 under the interpreter, whose 16-bit dots round)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a.to(OP_DTYPE), b.to(OP_DTYPE))


@triton.jit
def msa_decode_warp_kernel(
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
    KEYS: tl.constexpr = 64, BLOCK_W: tl.constexpr = 16, USE_PAGE_TABLE: tl.constexpr = True,
    HAS_QO_OFFSET: tl.constexpr = False, LAZY: tl.constexpr = 0, V_MMA: tl.constexpr = False,
    WARPS: tl.constexpr = 4,
):
    tl.static_assert(not V_MMA, "run with MATE_MSA_DECODE_VARIANT=fp8_v=gather (full-width V tiles)")
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    n_kvh = tl.num_programs(1)
    split = tl.program_id(2)
    ubase = (t.to(tl.int64) * n_kvh + kvh) * C
    hl = tl.arange(0, GP)
    h = kvh * RATIO + hl
    hvalid = hl < RATIO
    offs_d = tl.arange(0, HEAD_DIM)
    KW: tl.constexpr = KEYS // WARPS  # keys of a tile each warp owns
    OP: tl.constexpr = tl.float16 if IS_FP8 else q_ptr.dtype.element_ty
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + h[:, None] * stride_qh + offs_d[None, :],
                mask=hvalid[:, None], other=0.0)  # [GP, D]
    pos, kv_len, cnt = token_block_list(
        t, kvh, split, ubase, idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B,
        n_iter, page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages,
        W, u_page_ptr, u_blk_ptr, u_cnt_ptr + t * n_kvh + kvh, BLOCK_W, NUM_SPLITS, CAUSAL, USE_PAGE_TABLE,
        HAS_QO_OFFSET)
    q3 = tl.broadcast_to(q[None, :, :], [WARPS, GP, HEAD_DIM])
    limit = visible_limit(pos, kv_len, CAUSAL)
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    m_w = tl.full([WARPS, GP], float("-inf"), dtype=tl.float32)
    l_w = tl.zeros([WARPS, GP], dtype=tl.float32)
    acc = tl.zeros([WARPS, GP, HEAD_DIM], dtype=tl.float32)
    # key offset of each warp's slice element within a tile: [WARPS, 1, KW]
    kofs = (tl.arange(0, WARPS)[:, None, None] * KW + tl.arange(0, KW)[None, None, :])
    KPB: tl.constexpr = 128 // KEYS
    e_last = tl.maximum(e1 - 1, 0)
    page_n = tl.load(u_page_ptr + ubase + tl.minimum(e0, e_last))
    blk_n = tl.load(u_blk_ptr + ubase + tl.minimum(e0, e_last))
    for it in range(e0 * KPB, e1 * KPB):
        k0 = (it % KPB) * KEYS
        page = page_n
        blk = blk_n
        page_n, blk_n = next_list_entry(u_page_ptr, u_blk_ptr, ubase, it, e_last, KPB)
        kt, vt = load_kv_tile(k_desc, v_desc, page, kvh, n_kvh, k0, HEAD_DIM, KEYS, FLAT, HEAD_MAJOR)
        k_w = tl.permute(tl.reshape(kt, [WARPS, KW, HEAD_DIM]), (0, 2, 1))  # [WARPS, D, KW]
        s = _warp_dot(q3, k_w, OP) * qk_scale  # [WARPS, GP, KW]
        s = tl.where(blk * 128 + k0 + kofs <= limit, s, float("-inf"))
        m_new = tl.maximum(m_w, tl.max(s, axis=2))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, :, None])
        alpha = tl.exp2(m_w - m_use)
        l_w = l_w * alpha + tl.sum(p, axis=2)
        v_w = tl.reshape(vt, [WARPS, KW, HEAD_DIM])
        acc = acc * alpha[:, :, None] + _warp_dot(to_out_dtype(p, OP), v_w, OP)
        m_w = m_new
    # the warps' partial states merged once
    m_i = tl.max(m_w, axis=0)
    m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)
    scale_w = tl.exp2(m_w - m_ref[None, :])
    l_i = tl.sum(l_w * scale_w, axis=0)
    o = tl.sum(acc * scale_w[:, :, None], axis=0)  # [GP, D]
    l_safe, lse = finish_softmax(m_i, l_i)
    if NUM_SPLITS == 1:
        o_row = o_ptr + t.to(tl.int64) * stride_ot + h[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_row, to_out_dtype(o / l_safe[:, None] * v_scale, o_ptr.dtype.element_ty), mask=hvalid[:, None])
        tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=hvalid)
    else:
        prow = (split.to(tl.int64) * total_q + t) * HQ + h
        tl.store(op_ptr + prow[:, None] * HEAD_DIM + offs_d[None, :], o / l_safe[:, None], mask=hvalid[:, None])
        tl.store(lp_ptr + prow, lse, mask=hvalid)


def check(seed: int = 0) -> dict[str, tuple[float, float]]:
    """Interpreter check against the reference: the decode launcher with this kernel swapped in
    (restored after). Returns {dtype: (max |out - ref|, max |lse - ref|)}."""
    import torch

    import mate.ops.msa.sparse_decode as sd
    from mate.ops.msa.reference_attention import sparse_attention_reference
    from mate.ops.msa.sparse_attention import sparse_attention

    saved = sd.DECODE_VARIANT["fp8_v"], sd.msa_decode_t_kernel
    sd.DECODE_VARIANT["fp8_v"], sd.msa_decode_t_kernel = "gather", msa_decode_warp_kernel
    g = torch.Generator().manual_seed(seed)
    errors = {}
    try:
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            pages = 3 * 8
            k = torch.randn(pages, 128, 2, 128, generator=g).to(dtype)
            v = torch.randn(pages, 128, 2, 128, generator=g).to(dtype)
            q = (torch.randn(3, 16, 128, generator=g) * 0.3).to(dtype)
            idx = torch.randint(-1, 9, (3, 2, 4), generator=g, dtype=torch.int32)  # -1 and past-the-end ids too
            table = torch.randperm(pages, generator=g).to(torch.int32).view(3, 8)
            qi = torch.arange(4, dtype=torch.int32)
            kv = torch.tensor([300, 129, 1000], dtype=torch.int32)
            out, lse = sparse_attention(q, k, v, kv_block_indexes=idx, page_table=table, qo_indptr=qi, kv_lens=kv,
                                        decode=True, num_kv_splits=1, causal=True)
            ro, rl = sparse_attention_reference(q, k, v, idx, qi, kv, None, page_table=table, num_kv_heads=2)
            errors[str(dtype)] = ((out.float() - ro.float()).abs().max().item(),
                                  (lse - rl).abs().nan_to_num().max().item())
    finally:
        sd.DECODE_VARIANT["fp8_v"], sd.msa_decode_t_kernel = saved
    return errors


def compile_stats() -> None:
    """sm_90 build of the fp8 and bf16 bar-shape specializations (16 heads, 64-key tiles, 3 stages)."""

    from compile_msa_decode import ALIGNED, SHOWN, signature  # noqa: I001 (benchmarks/ on the path)

    from mate.testing.sass import compile_sm90, divisibility_attrs, opcode_counts
    from triton.compiler import ASTSource

    for dt, out in (("fp8e4nv", "bf16"), ("bf16", "bf16")):
        ce = dict(FLAT=True, KEYS=64, GP=16, C=16, HEAD_DIM=128, NUM_SPLITS=1, CAUSAL=True, IS_FP8=dt == "fp8e4nv",
                  HEAD_MAJOR=False, BLOCK_W=16, USE_PAGE_TABLE=True, HAS_QO_OFFSET=False, LAZY=0, stride_lh=1,
                  V_MMA=False, WARPS=4)
        sig = signature(dt, "NHD", out, True, 64, False)
        sig.update({k: "constexpr" for k in ce})
        src = ASTSource(fn=msa_decode_warp_kernel, signature=sig, constexprs=ce,
                        attrs=divisibility_attrs(sig, ALIGNED))
        for cap in (None, 128):
            opts = {"num_warps": 4, "num_stages": 3}
            if cap:
                opts["maxnreg"] = cap
            rep = compile_sm90(src, opts, ptxas=True, keep_text=True)
            ops = opcode_counts(rep.sass)
            shown = {o: c for o, c in sorted(ops.items()) if SHOWN.search(o) or o.startswith("F2")}
            body = _hmma_loop(rep.sass)
            counted = ("HMMA.16816.F32", "HMMA.16816.F32.BF16", "F2FP.F16.E4M3.UNPACK_B", "BAR.SYNC.DEFER_BLOCKING",
                       "SHFL.BFLY", "LDSM.16.M88.4", "MUFU.EX2")
            loop = {o: sum(1 for t in body if t.split()[0] == o) for o in counted}
            print(f"[{dt} cap {cap}] REG {rep.registers} spills {rep.spills} shared {rep.shared} "
                  f"instrs {sum(ops.values())} key loop {len(body)} {loop}; whole kernel {shown}")


def _hmma_loop(sass: str) -> list[str]:
    """The key loop's instructions: the shortest backward branch's span holding an HMMA."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*);", sass)]
    best: list[str] = []
    for at, text in lines:
        m = re.search(r"\bBRA\b.*0x([0-9a-f]+)\s*$", text)
        if m and int(m.group(1), 16) < at:
            body = [re.sub(r"^@!?U?P\w+\s+", "", t.strip()) for a, t in lines if int(m.group(1), 16) <= a <= at]
            if any("HMMA" in t for t in body) and (not best or len(body) < len(best)):
                best = body
    return best


_FP8_MMA_PTX = """.version 8.4
.target {arch}
.address_size 64
.visible .entry fp8_mma_sync(.param .u64 p) {{
  .reg .b32 a<4>; .reg .b32 b<2>; .reg .f32 d<4>; .reg .u64 rd;
  ld.param.u64 rd, [p];
  ld.global.v4.b32 {{a0, a1, a2, a3}}, [rd];
  ld.global.v2.b32 {{b0, b1}}, [rd+16];
  ld.global.v4.f32 {{d0, d1, d2, d3}}, [rd+32];
  mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32
      {{d0, d1, d2, d3}}, {{a0, a1, a2, a3}}, {{b0, b1}}, {{d0, d1, d2, d3}};
  st.global.v4.f32 [rd+32], {{d0, d1, d2, d3}};
  ret;
}}
"""


def fp8_mma_sync_sass() -> dict[str, dict[str, int]]:
    """What ptxas makes of one e4m3 ``mma.sync`` (m16n8k32, fp32 accumulation), the operation
    the per-warp design's inline PTX would issue: its matrix and conversion instructions for
    sm_89 (Ada) and sm_90a (Hopper), from Triton's own ptxas and cuobjdump."""
    import os
    import subprocess
    import tempfile

    from mate.testing.sass import TOOLS, opcode_counts

    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("sm_89", "sm_90a"):
            ptx, cubin = os.path.join(tmp, f"{arch}.ptx"), os.path.join(tmp, f"{arch}.cubin")
            with open(ptx, "w") as f:
                f.write(_FP8_MMA_PTX.format(arch=arch))
            subprocess.run([os.path.join(TOOLS, "ptxas"), f"-arch={arch}", ptx, "-o", cubin], check=True)
            sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", cubin], check=True,
                                  capture_output=True, text=True).stdout
            found[arch] = {op: n for op, n in sorted(opcode_counts(sass).items()) if re.match(r"[HQ]MMA|F2FP", op)}
    return found


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "check"
    if command == "check":
        for name, (err_o, err_l) in check().items():
            print(f"{name}: max |out - ref| {err_o:.3g}, max |lse - ref| {err_l:.3g}")
    elif command == "ptx":
        for arch, ops in fp8_mma_sync_sass().items():
            print(f"{arch}: {ops}")
    else:
        compile_stats()
