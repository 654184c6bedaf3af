"""Compiles the transposed MSA decode kernel for the H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_msa_decode.py [SPEC ...] [--out DIR]

A SPEC is ``dtype:stages:warps[:key=value...]`` with dtype bf16, fp16 or fp8 and keys
``keys`` (keys per TMA tile), ``splits``, ``maxnreg``, ``flat`` (0/1: 2D views of contiguous
caches), ``layout`` (NHD or HND), ``bw`` (ids per list padded: 16, the default, for
``bench_msa_attention``'s 16 blocks, 32 for 17), ``pt`` (0/1: page table or flat page list)
``qoff`` (0/1), ``lazy`` (the lazy-rescale threshold, 0 = off) and ``vmma`` (fp8: 0/1, Vᵀ by an
identity wgmma; default as :data:`~mate.ops.msa.sparse_decode.DECODE_VARIANT`); without one it
compiles the module defaults (:data:`mate.ops.msa.sparse_decode.DECODE_VARIANT`) for bf16 and fp8.
Per spec it prints
registers, local memory, spill instructions, shared memory, the SASS instruction count, the
instructions of the key loop, the counts of the tensor-core / TMA / barrier instructions and
ptxas warnings, read with the tools in Triton's wheel (the M3 tile: 16 heads of one KV head,
128-wide heads, causal).
"""

from __future__ import annotations

import argparse
import re

from triton.compiler import ASTSource

from mate.ops.msa import sparse_decode as sd
from mate.testing.sass import compile_sm90, divisibility_attrs, opcode_counts

DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8e4nv"}
ALIGNED = ("q_ptr", "u_page_ptr", "u_blk_ptr", "u_cnt_ptr", "o_ptr", "lse_ptr",
           "op_ptr", "lp_ptr", "stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_lt", "idx_ptr",
           "qo_indptr_ptr", "kv_lens_ptr", "page_table_ptr")
SHOWN = re.compile(r"GMMA|HMMA|F2FP|^UTMALDG|^BAR|^SYNCS")


def signature(dt: str, layout: str, out: str, flat: bool, keys: int, v_mma: bool = False) -> dict:
    def box(width: int) -> str:
        if flat:
            return f"[{keys}, {width}]"
        return f"[1, {keys}, 1, {width}]" if layout == "NHD" else f"[1, 1, {keys}, {width}]"

    return {"q_ptr": f"*{dt}", "stride_qt": "i32", "stride_qh": "i32",
            "k_desc": f"tensordesc<{dt}{box(128)}>", "v_desc": f"tensordesc<{dt}{box(64 if v_mma else 128)}>",
            "u_page_ptr": "*i32", "u_blk_ptr": "*i32",
            "u_cnt_ptr": "*i32", "o_ptr": f"*{out}", "stride_ot": "i32", "stride_oh": "i32", "lse_ptr": "*fp32",
            "stride_lt": "i32", "stride_lh": "constexpr", "op_ptr": "*fp32", "lp_ptr": "*fp32", "total_q": "i32",
            "HQ": "i32",
            "RATIO": "i32", "qk_scale": "fp32", "v_scale": "fp32",
            "idx_ptr": "*i32", "stride_it": "i32", "stride_ih": "i32", "qo_indptr_ptr": "*i32",
            "kv_lens_ptr": "*i32", "qo_offset_ptr": "*i32", "B": "i32", "n_iter": "i32", "page_table_ptr": "*i32",
            "stride_pt": "i32", "n_cols": "i32", "kv_indices_ptr": "*i32", "kv_page_indptr_ptr": "*i32",
            "n_indices": "i32", "num_pages": "i32", "W": "i32"}


def compile_one(spec: str, out_dir: str | None) -> None:
    name, stages, warps, *rest = spec.split(":")
    kw = dict(r.split("=") for r in rest)
    dt = DTYPES[name]
    layout = kw.get("layout", "NHD")
    flat = bool(int(kw.get("flat", 1)))
    keys = int(kw.get("keys", 128))
    bw = int(kw.get("bw", 16))
    ce = dict(FLAT=flat, KEYS=keys, GP=16, C=bw, HEAD_DIM=128, NUM_SPLITS=int(kw.get("splits", 1)), CAUSAL=True,
              IS_FP8=dt == "fp8e4nv", HEAD_MAJOR=layout == "HND", BLOCK_W=bw,
              USE_PAGE_TABLE=bool(int(kw.get("pt", 1))), HAS_QO_OFFSET=bool(int(kw.get("qoff", 0))),
              LAZY=int(kw.get("lazy", 0)), stride_lh=1,
              V_MMA=dt == "fp8e4nv" and bool(int(kw.get("vmma", sd.t_constexprs(True)["V_MMA"]))))
    sig = signature(dt, layout, "fp16" if dt == "fp16" else "bf16", flat, keys, ce["V_MMA"])
    sig.update({k: "constexpr" for k in ce})
    src = ASTSource(fn=sd.msa_decode_t_kernel, signature=sig, constexprs=ce, attrs=divisibility_attrs(sig, ALIGNED))
    opts = {"num_warps": int(warps), "num_stages": int(stages)}
    if "maxnreg" in kw:
        opts["maxnreg"] = int(kw["maxnreg"])
    tag = re.sub(r"\W+", "_", spec)
    rep = compile_sm90(src, opts, out_dir=out_dir, tag=tag, ptxas=True, keep_text=True)
    ops = opcode_counts(rep.sass)
    shown = {o: c for o, c in sorted(ops.items()) if SHOWN.search(o)}
    print(f"[{tag}] REG {rep.registers} LOCAL {rep.local} spills {rep.spills} shared {rep.shared} "
          f"instrs {sum(ops.values())} key loop {key_loop(rep.sass)} {shown} warn={rep.ptxas_warnings}")


def key_loop(sass: str) -> int | None:
    """Instructions of the key loop: the shortest backward branch's span holding a wgmma."""
    body = key_loop_body(sass)
    return None if body is None else len(body)


def key_loop_body(sass: str) -> list[str] | None:
    """The key loop's instructions (see :func:`key_loop`), predicates dropped."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*);", sass)]
    best = None
    for at, text in lines:
        m = re.search(r"\bBRA\b.*0x([0-9a-f]+)\s*$", text)
        if m and int(m.group(1), 16) < at:
            body = [re.sub(r"^@!?U?P\w+\s+", "", t.strip()) for a, t in lines if int(m.group(1), 16) <= a <= at]
            if any("GMMA" in t for t in body) and (best is None or len(body) < len(best)):
                best = body
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*")
    ap.add_argument("--out", default=None, help="keep cubin, PTX, TTGIR and SASS here")
    args = ap.parse_args()
    specs = args.specs
    if not specs:
        specs = []
        for fp8, name in ((False, "bf16"), (True, "fp8")):
            keys, stages, cap = sd.t_config(fp8)
            lazy = sd.t_constexprs(fp8)["LAZY"]
            specs.append(f"{name}:{stages}:4:keys={keys}" + (f":maxnreg={cap}" if cap else "")
                         + (f":lazy={lazy}" if lazy else ""))
    for spec in specs:
        compile_one(spec, args.out)


if __name__ == "__main__":
    main()
