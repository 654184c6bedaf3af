"""Compiles the mha Triton kernels (``mate.ops.mha.attention`` and ``prefill_tma``) for the
H200 (sm_90) on a machine without a GPU and prints registers, spills, shared memory and
tensor-core counts.

    python benchmarks/compile_mha.py

Builds the packed-heads kernel's ragged bf16 prefill (d = 128, MHA and GQA 4, causal) for each
prefill tiling of ``PREFILL_VARIANT`` (64 / 128 rows, split key loop or not) and its paged decode
(GQA 16), then the TMA prefill kernel at ``PREFILL_TMA``'s tiles over ragged K/V and paged caches
of 128- and 64-key pages (with a hash of its SASS, to tell whether a change moved the code).
"""

from __future__ import annotations

import hashlib

from triton.compiler import ASTSource

from mate.ops.mha import attention as att
from mate.ops.mha import prefill_tma as pt
from mate.testing.sass import compile_sm90, divisibility_attrs, opcode_counts

# Triton specializes integer arguments divisible by 16 at launch; these are for every real
# tensor (the page strides of a paged cache too: page_size * heads * d elements)
ALIGNED = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "stride_qt", "stride_qh", "stride_kb", "stride_kt",
           "stride_kh", "stride_vb", "stride_vt", "stride_vh", "stride_ot", "stride_oh")


def build(ratio: int, max_q: int, rows: int, split: bool, paged: bool = False, block_b: int = 0) -> str:
    tm, gp, block_m = att.mha_tiling(ratio, max_q, rows)
    i32, ptr = "i32", "*bf16"
    sig = {"q_ptr": ptr, "stride_qt": i32, "stride_qh": i32, "k_ptr": ptr, "v_ptr": ptr,
           "stride_kb": i32, "stride_kt": i32, "stride_kh": i32, "stride_vb": i32, "stride_vt": i32,
           "stride_vh": i32, "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "seqused_k_ptr": "*i32",
           "page_table_ptr": "*i32", "stride_pt": i32, "n_cols": i32, "num_pages": i32,
           "o_ptr": ptr, "stride_ot": i32, "stride_oh": i32, "lse_ptr": "*fp32", "stride_lh": i32, "stride_lt": i32,
           "RATIO": i32, "qk_scale": "fp32", "window_left": i32, "window_right": i32, "q_rows": i32, "k_rows": i32,
           "q_uniform": i32, "k_uniform": i32, "q_len_min": i32, "q_len_max": i32, "batch": i32, "n_mblk": i32}
    cx = {"TM": tm, "GP": gp, "BLOCK_M": block_m, "BLOCK_N": 64, "HEAD_DIM": 128, "PAGE_SIZE": 64 if paged else 1,
          "PAGED": paged, "HAS_CU_K": not paged, "HAS_SEQUSED": paged, "HAS_LEFT": False, "HAS_RIGHT": True,
          "SKIP_WHOLE": False, "SPLIT_LOOP": split and not paged, "HAS_CU_Q": True, "BLOCK_B": block_b}
    sig.update({k: "constexpr" for k in cx})
    src = ASTSource(fn=att._mha_fwd_kernel, signature=sig, constexprs=cx, attrs=divisibility_attrs(sig, ALIGNED))
    rep = compile_sm90(src, {"num_warps": att.mha_num_warps(block_m), "num_stages": 2})
    ops = opcode_counts(rep.sass)
    mma = sum(v for k, v in ops.items() if "MMA" in k)
    bars = sum(v for k, v in ops.items() if k.startswith("BAR"))
    return (f"ratio {ratio:2d} rows {block_m:3d} split {int(split)} paged {int(paged)} block_b {block_b:4d}: "
            f"{rep.registers} regs, "
            f"{rep.spills} spill instr, {rep.shared} B shared, {mma} MMA, {bars} BAR, {sum(ops.values())} instr")


def build_tma(page_size: int, block_b: int = 0) -> str:
    """The TMA prefill kernel at ``PREFILL_TMA``'s settings, ragged (page_size 0) or paged; with
    ``block_b`` > 0 on the virtual grid of a batch of up to ``block_b`` - 1 requests."""
    cfg = pt.PREFILL_TMA
    bm, bn, d, dt = int(cfg["block_m"]), int(cfg["block_n"]), 128, "bf16"
    paged = page_size > 0
    kd = f"tensordesc<{dt}[1, {bn}, 1, {d}]>" if paged else f"tensordesc<{dt}[{bn}, {d}]>"
    i32 = "i32"
    sig = {"q_desc": f"tensordesc<{dt}[{bm}, {d}]>", "k_desc": kd, "v_desc": kd, "o_ptr": f"*{dt}",
           "stride_ot": i32, "stride_oh": i32, "lse_ptr": "*fp32", "stride_lh": i32, "stride_lt": i32,
           "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "seqused_k_ptr": "*i32", "page_table_ptr": "*i32",
           "stride_pt": i32, "n_cols": i32, "num_pages": i32, "RATIO": i32, "qk_scale": "fp32",
           "window_right": i32, "q_rows": i32, "k_rows": i32, "q_uniform": i32, "k_uniform": i32, "min_q": i32,
           "batch": i32, "n_mblk": i32}
    cx = {"BLOCK_M": bm, "BLOCK_N": bn, "HEAD_DIM": d, "HAS_RIGHT": True, "SKIP_WHOLE": False, "HAS_CU_Q": True,
          "HAS_CU_K": not paged, "HAS_SEQUSED": paged, "PAGED": paged, "PAGE_SIZE": max(page_size, 1),
          "HEADS_INNER": bool(cfg["heads_inner"]), "BLOCK_B": block_b}
    sig.update({k: "constexpr" for k in cx})
    src = ASTSource(fn=pt._mha_prefill_tma_kernel, signature=sig, constexprs=cx,
                    attrs=divisibility_attrs(sig, ("o_ptr", "lse_ptr", "cu_q_ptr", "cu_k_ptr", "stride_ot",
                                                   "stride_oh")))
    rep = compile_sm90(src, {"num_warps": int(cfg["warps"]), "num_stages": pt.prefill_stages(d)})
    ops = opcode_counts(rep.sass)
    tc = {o: c for o, c in ops.items() if "GMMA" in o or "UTMALDG" in o}
    digest = hashlib.md5(rep.sass.encode()).hexdigest()[:10]
    return (f"tma {bm}x{bn} pages {page_size or '-':>3} block_b {block_b:4d}: {rep.registers} regs, "
            f"{rep.spills} spill instr, {rep.shared} B shared, {sum(ops.values())} instr, {tc}, sass {digest}")


def main() -> None:
    for ratio in (1, 4):
        for rows, split in ((64, False), (64, True), (128, False), (128, True)):
            print(build(ratio, 16384, rows, split), flush=True)
    print(build(16, 1, 64, False, paged=True), flush=True)
    print(build(4, 63, 64, False, paged=True, block_b=256), flush=True)  # a mixed batch's short chunks
    for page_size in (0, 128, 64):
        print(build_tma(page_size), flush=True)
    for block_b in (256, 2048):
        print(build_tma(128, block_b), flush=True)


if __name__ == "__main__":
    main()
