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
    "lanes": ("lanes", 1),
    "lanes_slack2": ("lanes_slack2", 1),
    "lanes_novote": ("lanes_novote", 1),
    "lanes_fast": ("lanes_fast", 1),
    "lanes_fast_qpos": ("lanes_fast_qpos", 1),
    # (method, NW, NW, maxnreg): the default caps registers at 32
    "lanes_warps2": ("lanes_warps", 2, 2, 32),
    "lanes_warps4": ("lanes_warps", 4, 4, 32),
    "lanes_warps8": ("lanes_warps", 8, 8, 32),
    "lanes_warps4_qpos": ("lanes_warps_qpos", 4, 4, 32),
    "lanes_warps4_uncapped_qpos": ("lanes_warps_qpos", 4, 4, 0),
}


def compile_fast(name: str, method: str, chunk: int, k: int, sass_dir: str | None) -> None:
    """The fast lanes kernel, slack 2, full rows."""
    sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "num_tiles": "i32",
           "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "W": "i32"}
    constexprs = {"R": max(chunk, 32) // 32, "W_P2": 64, "G1": max(16, triton.next_power_of_2(k)), "SLACK": 2,
                  "VOTE": True, "HAS_QPOS": method.endswith("qpos"), "FULL": True}
    sig.update({c: "constexpr" for c in constexprs})
    src = ASTSource(fn=tk._topk_lanes_fast_kernel, signature=sig, constexprs=constexprs,
                    attrs=divisibility_attrs(sig, ["s_ptr", "out_ptr", "qpos_ptr"]))
    rep = compile_sm90(src, {"num_warps": 1}, out_dir=sass_dir, tag=f"topk_{name}_{chunk}", keep_text=True)
    report(name, chunk, 1, 1, rep)


def compile_warps(name: str, method: str, nw: int, chunk: int, sass_dir: str | None, maxnreg: int = 0) -> None:
    """The Gluon kernel of NW one-row warps per program (topk_warps.py), full rows, registers
    capped at ``maxnreg`` (0: no cap). A correct build has no shared memory and no barrier
    (the warps never talk)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from mate.ops.msa import topk_warps as tw
    sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "n_rows": "i32", "num_tiles": "i32",
           "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "W": "i32"}
    constexprs = {"R": max(chunk, 32) // 32, "NW": nw, "HAS_QPOS": method.endswith("qpos"), "FULL": True}
    sig.update({c: "constexpr" for c in constexprs})
    src = GluonASTSource(fn=tw._topk_lanes_warps_kernel, signature=sig, constexprs=constexprs,
                         attrs=divisibility_attrs(sig, ["s_ptr", "out_ptr", "qpos_ptr"]))
    rep = compile_sm90(src, {"num_warps": nw, **({"maxnreg": maxnreg} if maxnreg else {})}, out_dir=sass_dir,
                       tag=f"topk_{name}_{chunk}", keep_text=True)
    sync = sum(bool(re.search(r"\b(BAR|LDS|STS|MEMBAR)\b", ln)) for ln in rep.sass.splitlines())
    div = sum(bool(re.search(r"BRA\.DIV|WARPSYNC|BSSY", ln)) for ln in rep.sass.splitlines())
    report(name, chunk, nw, nw, rep)
    print(f"{'':22s} shared {rep.shared} B, {sync} BAR/LDS/STS/MEMBAR instrs, {div} BRA.DIV/WARPSYNC/BSSY, "
          f"{rep.spills} STL/LDL")


def compile_one(name: str, chunk: int, k: int, sass_dir: str | None) -> None:
    method, rows, *warps = VARIANTS[name]
    if method.startswith("lanes_warps"):
        if chunk <= 256:
            compile_warps(name, method, rows, chunk, sass_dir, *warps[1:])
        return
    if method.startswith("lanes_fast"):
        compile_fast(name, method, chunk, k, sass_dir)
        return
    sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "n_rows": "i32", "num_tiles": "i32",
           "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "counted": "i32", "W": "i32",
           "has_qpos": "i32"}
    if method.startswith("lanes"):
        sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "num_tiles": "i32",
               "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "W": "i32", "has_qpos": "i32"}
        constexprs = {"R": max(chunk, 32) // 32, "W_P2": 64, "G1": max(16, triton.next_power_of_2(k)),
                      "SLACK": 2 if method == "lanes_slack2" else 0, "VOTE": method != "lanes_novote"}
        sig.update({c: "constexpr" for c in constexprs})
        src = ASTSource(fn=tk._topk_lanes_kernel, signature=sig, constexprs=constexprs,
                        attrs=divisibility_attrs(sig, ["s_ptr", "out_ptr", "qpos_ptr"]))
        report(name, chunk, 1, 1, compile_sm90(src, {"num_warps": 1}, out_dir=sass_dir, tag=f"topk_{name}_{chunk}",
                                                keep_text=True))
        return
    cfg = tk.topk_config(chunk, k, max(4096, chunk), method=method, rows_per_program=rows)
    if warps:
        cfg["num_warps"] = warps[0]
    constexprs = {"K": k, "W_P2": 64, "ROWS": cfg["ROWS"], "CHUNK": cfg["CHUNK"]}
    if method == "interval":
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
    rep = compile_sm90(src, {"num_warps": cfg["num_warps"]}, out_dir=sass_dir, tag=f"topk_{name}_{chunk}",
                       keep_text=True)
    report(name, chunk, cfg["ROWS"], cfg["num_warps"], rep)


def report(name: str, chunk: int, rows: int, warps: int, rep) -> None:
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
    print(f"{name:22s} chunk={chunk:5d} rows={rows} warps={warps}: REG {rep.registers} "
          f"LOCAL {rep.local} | SASS {len(instrs)} instrs, {shfl} SHFL, backward branches {loops}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, nargs="*", default=[256, 1024])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--sass", default=None, help="keep cubin, PTX, TTGIR + SASS text here")
    args = ap.parse_args()
    for chunk in args.chunk:
        for name in args.variants:
            compile_one(name, chunk, args.k, args.sass)


if __name__ == "__main__":
    main()
