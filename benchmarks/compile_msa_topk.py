"""Compiles the MSA top-k selection kernel for the H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_msa_topk.py [--chunk 256] [--sass DIR]

For each threshold variant it prints registers, local memory (spills) and the SASS
instruction count of the whole kernel and the span of each backward branch (the first is
the threshold search loop's body; later ones are warp-divergence fallbacks), read with
Triton's ``cuobjdump``.
"""

from __future__ import annotations

import argparse
import re

import triton
from triton.compiler import ASTSource

from mate.ops.msa import topk as tk
from mate.ops.msa import topk_gluon as tg
from mate.testing.sass import compile_sm90, divisibility_attrs

VARIANTS = {  # name: (method, rows per program[, warps])
    "bitonic": ("bitonic", None),
    "radix": ("radix", 1),
    "interval": ("interval", 1),
    "interval_rows2": ("interval", 2),
    "interval_rows2_warps2": ("interval", 2, 2),
    "interval_rows4_warps4": ("interval", 4, 4),
    "interval_warps2": ("interval", 1, 2),
    "interval_warps4": ("interval", 1, 4),
    # one-row programs as a loop over tokens (programs_per_sm), next row loaded ahead or not
    "interval_loop": ("interval_loop", 1),
    "interval_loop_noprefetch": ("interval_loop_noprefetch", 1),
    "interval_loop_maxnreg64": ("interval_loop", 1, None, 64),  # 32 one-warp programs per SM
    "interval_loop_warps2": ("interval_loop", 1, 2),
    "interval_loop_warps4": ("interval_loop", 1, 4),
}


def compile_one(name: str, chunk: int, k: int, sass_dir: str | None) -> None:
    method, rows, *extra = VARIANTS[name]
    warps = [w for w in extra[:1] if w]
    maxnreg = extra[1] if len(extra) > 1 else None
    sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "n_rows": "i32", "num_tiles": "i32",
           "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "counted": "i32", "W": "i32",
           "has_qpos": "i32"}
    cfg = tk.topk_config(chunk, k, max(4096, chunk), method=method.split("_")[0], rows_per_program=rows)
    if warps:
        cfg["num_warps"] = warps[0]
    constexprs = {"K": k, "W_P2": 64, "ROWS": cfg["ROWS"], "CHUNK": cfg["CHUNK"]}
    if method.startswith("interval_loop"):
        kernel = tk._topk_interval_persistent_kernel
        sig = {n: t for n, t in sig.items() if n not in ("n_rows", "counted")}
        sig["total_q"] = "i32"
        constexprs = {"CHUNK": cfg["CHUNK"], "G1": min(cfg["CHUNK"], max(16, triton.next_power_of_2(k))),
                      "W_P2": 64, "PREFETCH": method == "interval_loop"}
        sig = {n: sig[n] for n in ["s_ptr", "out_ptr", "qpos_ptr", "total_q", "num_tiles", "num_valid_pages", "H",
                                   "fb", "fe", "W", "has_qpos"]}
    elif method == "interval":
        kernel = tk._topk_interval_kernel
        constexprs["G"] = min(cfg["CHUNK"], max(32, triton.next_power_of_2(k + 1)))
        constexprs["G1"] = min(cfg["CHUNK"], max(16, triton.next_power_of_2(k)))
    else:
        kernel = tk._topk_select_kernel
        constexprs.update(SINGLE=cfg["SINGLE"], RADIX=method == "radix")
    sig.update({c: "constexpr" for c in constexprs})
    # what the launcher's specialization sees: 16-byte aligned tensors, num_tiles % 16 == 0
    # (256, 1024) where num_tiles is specialized (not in the interval kernel)
    aligned = ["s_ptr", "out_ptr", "qpos_ptr"] + (["num_tiles"] if chunk % 16 == 0 and method == "radix" else [])
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=divisibility_attrs(sig, aligned))
    opts = {"num_warps": cfg["num_warps"]} | ({"num_stages": 1} if method.startswith("interval_loop") else {})
    if maxnreg:
        opts["maxnreg"] = maxnreg
    rep = compile_sm90(src, opts, out_dir=sass_dir, tag=f"topk_{name}_{chunk}", keep_text=True)
    sass = rep.sass
    instrs = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,6}\*/\s+\S", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4,6})\*/", ln).group(1), 16) for ln in instrs]
    # loops: backward branches; report each loop's body size in instructions
    loops = []
    for ln, a in zip(instrs, addr):
        tgt = re.search(r"BRA[^;]*?0x([0-9a-f]+)\s*;", ln)
        if tgt and int(tgt.group(1), 16) < a:
            loops.append((a - int(tgt.group(1), 16)) // 16 + 1)
    shfl = sum("SHFL" in ln for ln in instrs)
    print(f"{name:22s} chunk={chunk:5d} rows={cfg['ROWS']} warps={cfg['num_warps']}: REG {rep.registers} "
          f"LOCAL {rep.local} | SASS {len(instrs)} instrs, {shfl} SHFL, backward branches {loops}")


GLUON_VARIANTS = {  # name: (rows per warp, warps, coalesced load)
    "gluon": (None, 4, False),
    "gluon_warps2": (None, 2, False),
    "gluon_warps1": (None, 1, False),
    "gluon_coalesce": (None, 4, True),
    "gluon_rpw4": (4, 4, False),
    "gluon_rpw4_warps2": (4, 2, False),
    "gluon_rpw2": (2, 4, False),
    "gluon_rpw2_warps1": (2, 1, False),
    "gluon_rpw1": (1, 4, False),
}


def compile_gluon(name: str, chunk: int, k: int, sass_dir: str | None) -> None:
    """The Gluon kernel (:mod:`mate.ops.msa.topk_gluon`); ``W = k + 1`` (one forced block),
    static instructions per row = SASS / rows per warp (both tie paths, the loop body once)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    rpw, warps, coalesce = GLUON_VARIANTS[name]
    cfg = tg.gluon_topk_config(chunk, k, k + 1, rpw, coalesce)
    if cfg is None:
        print(f"{name:22s} chunk={chunk:5d}: not taken (interval)")
        return
    sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "n_rows": "i32", "num_tiles": "i32",
           "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "W": "i32", "has_qpos": "i32"}
    sig.update({c: "constexpr" for c in cfg})
    src = GluonASTSource(fn=tg._topk_gluon_kernel, signature=sig, constexprs=cfg,
                         attrs=divisibility_attrs(sig, ["s_ptr", "out_ptr", "qpos_ptr", "num_tiles"]))
    rep = compile_sm90(src, {"num_warps": warps}, out_dir=sass_dir, tag=f"topk_{name}_{chunk}", keep_text=True)
    instrs = [ln for ln in rep.sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,6}\*/\s+\S", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]{4,6})\*/", ln).group(1), 16) for ln in instrs]
    loops = []
    for ln, a in zip(instrs, addr):
        tgt = re.search(r"BRA[^;]*?0x([0-9a-f]+)\s*;", ln)
        if tgt and int(tgt.group(1), 16) < a:
            loops.append((a - int(tgt.group(1), 16)) // 16 + 1)
    ldg = sum("LDG" in ln for ln in instrs)
    shfl = sum("SHFL" in ln for ln in instrs)
    rows = 32 // cfg["TPR"]  # rows per warp: each warp runs the whole program for them
    print(f"{name:22s} chunk={chunk:5d} rows/warp={32 // cfg['TPR']} warps={warps}: REG {rep.registers} "
          f"LOCAL {rep.local} spills {rep.spills} shared {rep.shared} | SASS {len(instrs)} instrs "
          f"({len(instrs) / rows:.0f} per row), {ldg} LDG, {shfl} SHFL, backward branches {loops}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, nargs="*", default=[256, 1024])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS) + list(GLUON_VARIANTS))
    ap.add_argument("--sass", default=None, help="keep cubin, PTX, TTGIR + SASS text here")
    args = ap.parse_args()
    for chunk in args.chunk:
        for name in args.variants:
            if name in GLUON_VARIANTS:
                compile_gluon(name, chunk, args.k, args.sass)
            else:
                compile_one(name, chunk, args.k, args.sass)


if __name__ == "__main__":
    main()
