"""Compiles the mha Triton kernel (``mate.ops.mha.attention``) for the H200 (sm_90) on a
machine without a GPU and prints registers, spills, shared memory and tensor-core counts.

    python benchmarks/compile_mha.py

Builds the ragged bf16 prefill (d = 128, MHA and GQA 4, causal) for each prefill tiling of
``PREFILL_VARIANT`` (64 / 128 rows, split key loop or not) and the paged decode (GQA 16).
"""

from __future__ import annotations

from triton.compiler import ASTSource

from mate.ops.mha import attention as att
from mate.testing.sass import compile_sm90, divisibility_attrs, opcode_counts

# Triton specializes integer arguments divisible by 16 at launch; these are for every real
# tensor (the page strides of a paged cache too: page_size * heads * d elements)
ALIGNED = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "stride_qt", "stride_qh", "stride_kb", "stride_kt",
           "stride_kh", "stride_vb", "stride_vt", "stride_vh", "stride_ot", "stride_oh")


def build(ratio: int, max_q: int, rows: int, split: bool, paged: bool = False) -> str:
    tm, gp, block_m = att.mha_tiling(ratio, max_q, rows)
    i32, ptr = "i32", "*bf16"
    sig = {"q_ptr": ptr, "stride_qt": i32, "stride_qh": i32, "k_ptr": ptr, "v_ptr": ptr,
           "stride_kb": i32, "stride_kt": i32, "stride_kh": i32, "stride_vb": i32, "stride_vt": i32,
           "stride_vh": i32, "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "seqused_k_ptr": "*i32",
           "page_table_ptr": "*i32", "stride_pt": i32, "n_cols": i32, "num_pages": i32,
           "o_ptr": ptr, "stride_ot": i32, "stride_oh": i32, "lse_ptr": "*fp32", "stride_lh": i32, "stride_lt": i32,
           "RATIO": i32, "qk_scale": "fp32", "window_left": i32, "window_right": i32, "q_rows": i32, "k_rows": i32,
           "q_uniform": i32, "k_uniform": i32}
    cx = {"TM": tm, "GP": gp, "BLOCK_M": block_m, "BLOCK_N": 64, "HEAD_DIM": 128, "PAGE_SIZE": 64 if paged else 1,
          "PAGED": paged, "HAS_CU_K": not paged, "HAS_SEQUSED": paged, "HAS_LEFT": False, "HAS_RIGHT": True,
          "SKIP_WHOLE": False, "SPLIT_LOOP": split and not paged, "HAS_CU_Q": True}
    sig.update({k: "constexpr" for k in cx})
    src = ASTSource(fn=att._mha_fwd_kernel, signature=sig, constexprs=cx, attrs=divisibility_attrs(sig, ALIGNED))
    rep = compile_sm90(src, {"num_warps": att.mha_num_warps(block_m), "num_stages": 2})
    ops = opcode_counts(rep.sass)
    mma = sum(v for k, v in ops.items() if "MMA" in k)
    bars = sum(v for k, v in ops.items() if k.startswith("BAR"))
    return (f"ratio {ratio:2d} rows {block_m:3d} split {int(split)} paged {int(paged)}: {rep.registers} regs, "
            f"{rep.spills} spill instr, {rep.shared} B shared, {mma} MMA, {bars} BAR, {sum(ops.values())} instr")


def main() -> None:
    for ratio in (1, 4):
        for rows, split in ((64, False), (64, True), (128, False), (128, True)):
            print(build(ratio, 16384, rows, split), flush=True)
    print(build(16, 1, 64, False, paged=True), flush=True)


if __name__ == "__main__":
    main()
