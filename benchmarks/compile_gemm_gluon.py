"""Compiles the Gluon groupwise FP8 GEMM for the H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_gemm_gluon.py [--out DIR]

For each configuration it prints registers, stack and local memory (spills), dynamic
shared memory, ptxas warnings (e.g. wgmma serialization) and counts of the SASS
instructions that matter (QGMMA tensor-core ops, UTMALDG TMA loads, barriers, wgmma
waits), read with the ``ptxas``/``cuobjdump`` shipped in Triton's wheel. Exits non-zero
when a configuration spills, exceeds the 227 KB of shared memory, lacks QGMMA, or ptxas
warns.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from mate.ops.gemm import groupwise_gluon as gg

SMEM_LIMIT = 227 * 1024
PATTERN = re.compile(r"\b(QGMMA\.\S+|UTMALDG\S*|SYNCS\.\S+|BAR\.\S+|WARPGROUP\.\S+|STL\S*|LDL\S*|USETMAXREG\S*)")
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

# name: (LAYOUT, BLOCK_M, BLOCK_N, STAGES, SPLIT_N)
CONFIGS = {
    "contig 128x128 st6": (1, 128, 128, 6, False),
    "contig 128x128 st5": (1, 128, 128, 5, False),
    "plain 128x128 st6": (0, 128, 128, 6, False),
    "plain 128x64 st8": (0, 128, 64, 8, False),
    "plain 64x256 splitN st4": (0, 64, 256, 4, True),
    "plain 64x128 splitN st6": (0, 64, 128, 6, True),
}


def _desc_type(block_rows: int) -> str:
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, 128], gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{block_rows}, 128],{layout}>"


def compile_one(name, layout, bm, bn, stages, split_n, out_dir) -> bool:
    sig = {"a_desc": _desc_type(bm), "b_desc": _desc_type(bn), "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "c_ptr": "*bf16", "idx_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "G": "i32",
           "stride_asm": "i32", "stride_ask": "i32", "stride_bsg": "i32", "stride_bsn": "i32", "stride_bsk": "i32",
           "stride_cm": "i32"}
    constexprs = {"LAYOUT": layout, "BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8, "STAGES": stages,
                  "SPLIT_N": split_n}
    sig.update({k: "constexpr" for k in constexprs})
    names = list(sig)
    # the launcher's pointers are 16-byte aligned; N, K and the strides of the benchmark shapes
    # are multiples of 16 (Triton specializes such integers at launch)
    aligned = ("as_ptr", "bs_ptr", "c_ptr", "idx_ptr", "N", "K", "stride_asm", "stride_cm")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = GluonASTSource(fn=gg.fp8_groupwise_gluon_kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4, "maxnreg": gg.GLUON_MAX_REGS})
    tag = re.sub(r"\W+", "_", name)
    cubin = os.path.join(out_dir, f"{tag}.cubin")
    ptx = os.path.join(out_dir, f"{tag}.ptx")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    with open(ptx, "w") as f:
        f.write(kernel.asm["ptx"])
    ptxas = subprocess.run([os.path.join(TOOLS, "ptxas"), "-v", "-arch=sm_90a", ptx, "-o", os.devnull],
                           capture_output=True, text=True)
    warnings = [ln for ln in (ptxas.stdout + ptxas.stderr).splitlines()
                if "warning" in ln.lower() or "performance loss" in ln.lower()]
    usage = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "--dump-resource-usage", cubin], capture_output=True,
                           text=True, check=True).stdout
    sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "--dump-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    res = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    counts = collections.Counter(m.group(1).rstrip(";") for m in PATTERN.finditer(sass))
    shared = kernel.metadata.shared
    spills = sum(v for k, v in counts.items() if k.startswith(("STL", "LDL")))
    print(f"{name}: {res.get('REG')} registers (launch), stack {res.get('STACK')} B, local {res.get('LOCAL')} B, "
          f"{spills} spill instructions, shared {shared} B ({shared / 1024:.0f} KB)")
    for w in warnings:
        print("    ptxas:", w)
    for k, n in sorted(counts.items()):
        print(f"    {k}: {n}")
    has_mma = any(k.startswith("QGMMA") for k in counts)
    return shared <= SMEM_LIMIT and has_mma and spills == 0 and not warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to keep the cubins and PTX (default: a temporary folder)")
    ap.add_argument("--only", default="", help="substring of the config names to compile")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="mate_gemm_gluon_")
    os.makedirs(out_dir, exist_ok=True)
    ok = True
    for name, cfg in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        try:
            ok &= compile_one(name, *cfg, out_dir)
        except Exception as exc:  # report every config, then fail
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
            ok = False
    print("cubins in", out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
