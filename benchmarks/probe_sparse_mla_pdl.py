"""Probe (prepared in session 24, run in session 25): programmatic dependent launch (PDL) between
the sparse MLA decode of a split plan and its combine kernel.

    python benchmarks/probe_sparse_mla_pdl.py            # H200: interleaved A/B
    python benchmarks/probe_sparse_mla_pdl.py --compile  # CPU: sm_90 builds of the patched kernels

At small batches the split decode is two launches (the 64-head Gluon kernel, then the combine)
and the time is mostly fixed cost: B=1 q1 H=128 takes 20.1 us (session 24) against FlashMLA's
17.8, B=8 q1 H=128 22.0 us. With PDL the combine's launch overlaps the decode: the combine is
launched with ``launch_pdl=True`` and waits (``griddepcontrol.wait``) before its first load, and
the decode may signal (``griddepcontrol.launch_dependents``) at its start, so that the combine's
programs are resident on the SMs the decode leaves idle when it ends. Nothing is read before the
wait, so the results cannot change; the probe checks them bit for bit.

The kernels are not changed: the probe builds patched copies (the combine kernel with the wait,
the decode module with the signal, and optionally the wait too, for a decode launched with PDL
after the previous call's combine) and swaps ``decode.launch_combine`` for the PDL launch while
its cases are captured. Cases per shape (CUDA-graph replays, interleaved): ``module`` (today's
launches), ``pdl combine`` (the combine with PDL, the decode unchanged), ``+ signal`` (the
decode signals at its start), ``pdl both`` (also the decode launched with PDL, waiting at its
start for the previous combine).

H200, session 25 (``benchmarks/results/2026-11-30-h200-s25-probes.txt``; us, module / pdl combine /
+ signal / pdl both; bit-identical everywhere): B=1 q1 H=128 20.5 / 20.6 / 19.5 / 19.3; B=1 q2
20.3 / 20.6 / 19.7 / 19.5; B=8 q1 H=128 22.3 / 22.2 / 23.8 / 23.6; B=8 q1 H=64 20.9 / 21.0 /
20.3 / 20.1; B=16 q1 H=128 31.7 / 31.5 / 32.1 / 32.0; B=32 q1 H=128 50.3 / 50.4 / 50.2 / 50.1.
About 1 us at B=1, 1.5 us lost at B=8 H=128 (a grid that fills the GPU: the combine's early
programs crowd onto the few idle SMs). Adopted for grids with at most half as many programs as
SMs (``metadata.PDL_MAX_GRID_FRACTION``, ``DecodeMetadata.pdl``); this probe's ``module`` case
launches without it.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from patched_source import apply_edits, import_source  # noqa: E402

from mate.ops.sparse_mla import decode as dmod  # noqa: E402
from mate.ops.sparse_mla import decode_gluon as dg  # noqa: E402

SHAPES = [(1, 1, 128), (1, 2, 128), (8, 1, 128), (8, 1, 64), (16, 1, 128), (32, 1, 128)]  # (B, q_len, H)

COMBINE_HEADER = ("import triton\nimport triton.language as tl\n\n"
                  "from mate._core.triton_helpers import to_bf16  # noqa: F401\n\n\n")
GLUON_HELPERS = '''

@gluon.jit
def _pdl_signal(dep):
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r", [dep.to(gl.int32)],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pdl_wait(dep):
    gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [dep.to(gl.int32)],
                              dtype=gl.int32, is_pure=False, pack=1)
'''


def combine_module():
    """The combine kernel with ``gdc_wait()`` before anything else, as ``combine_pdl_kernel``."""
    first = "    pid_h = tl.program_id(0)\n"
    src = apply_edits(inspect.getsource(dmod.sparse_mla_decode_combine_kernel.fn),
                      [("def sparse_mla_decode_combine_kernel(", "def combine_pdl_kernel("),
                       (first, "    tl.extra.cuda.gdc_wait()\n" + first)])
    return import_source("mate_combine_pdl", COMBINE_HEADER + src)


def decode_module(wait: bool):
    """``decode_gluon.py`` with the 64-head kernel signalling its dependents at its start (and,
    with ``wait``, first waiting for the kernel before it)."""
    start = "    bt = gl.program_id(2).to(gl.int64)  # query position b * q_len + t\n"
    src = apply_edits(inspect.getsource(dg),
                      [("GLUON_BLOCK_H = 64", GLUON_HELPERS.lstrip("\n") + "\n\nGLUON_BLOCK_H = 64"),
                       (start, start + ("    _pdl_wait(bt)\n" if wait else "") + "    _pdl_signal(bt)\n")])
    return import_source("mate_decode_pdl_wait" if wait else "mate_decode_pdl", src)


def launch_combine_pdl(mod):
    """``decode.launch_combine`` with the patched kernel launched with PDL."""
    def launch(partial_o, partial_lse, out, lse, bmm2_scale, H, num_splits, rows):
        block_hc, block_d = dmod.combine_tiling(H, num_splits)
        mod.combine_pdl_kernel[(dmod.cdiv(H, block_hc), dmod.HEAD_DIM_V // block_d, rows)](
            partial_o, partial_lse, out, lse, bmm2_scale, H, NUM_SPLITS=num_splits,
            SPLITS_P2=dmod.next_power_of_2(num_splits), BLOCK_HC=block_hc, BLOCK_D=block_d, D_V=dmod.HEAD_DIM_V,
            num_warps=4, launch_pdl=True)
    return launch


def compile_only() -> int:
    """sm_90 builds of the patched kernels on the CPU: the PTX has the PDL instructions."""
    from compile_sparse_mla_gluon import compile_decode
    from triton.compiler import ASTSource

    from mate.testing.sass import compile_sm90, divisibility_attrs

    cm = combine_module()
    sig = {"po_ptr": "*fp16", "plse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "out_scale": "fp32",
           "H": "i32"}
    cx = {"NUM_SPLITS": 8, "SPLITS_P2": 8, "BLOCK_HC": 16, "BLOCK_D": 128, "D_V": 512}
    sig.update({k: "constexpr" for k in cx})
    rep = compile_sm90(ASTSource(fn=cm.combine_pdl_kernel, signature=sig, constexprs=cx,
                                 attrs=divisibility_attrs(sig, ("po_ptr", "plse_ptr", "out_ptr", "lse_ptr"))),
                       {"num_warps": 4, "launch_pdl": True})
    ptx = rep.kernel.asm["ptx"]
    print(f"combine: {rep.registers} registers, griddepcontrol.wait {ptx.count('griddepcontrol.wait')}")
    ok = ptx.count("griddepcontrol.wait") == 1
    for wait in (False, True):
        mod = decode_module(wait)
        cxd = {"SPLIT": True, "HAS_SEQ_LENS": True, "STAGES": 2, "BLOCK_H": 64, "BLOCK_N": 64}
        rep = compile_decode(mod.sparse_mla_decode_gluon_kernel, True, cxd, 8, None, "pdl", None, ptxas=True)
        ptx = rep.kernel.asm["ptx"]
        n_sig, n_wait = ptx.count("griddepcontrol.launch_dependents"), ptx.count("griddepcontrol.wait")
        print(f"decode (wait={wait}): {rep.registers} registers, {rep.spills} spills, signal {n_sig}, wait {n_wait}")
        ok &= n_sig == 1 and n_wait == int(wait) and rep.spills == 0
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="sm_90 builds only (CPU)")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if args.compile:
        return compile_only()

    import torch
    from bench_sparse_mla import PAGE, TOP_K, _cache, _sets

    from mate.ops.sparse_mla.gluon_common import launch_decode
    from mate.ops.sparse_mla.metadata import plan_decode
    from mate.testing.bench import time_interleaved

    combine_pdl = launch_combine_pdl(combine_module())
    signal_mod, wait_mod = decode_module(False), decode_module(True)
    orig_combine = dmod.launch_combine
    scale = 1 / math.sqrt(576)

    def call(s, kv, md, kernel, combine, pdl_decode: bool):
        def run():
            dmod.launch_combine = combine  # launch_decode looks it up at call time
            try:
                launch_decode(kernel, (dmod.cdiv(s["q"].shape[2], 64),), s["q"], kv.view(-1, 576), s["idx"], s["sl"],
                              s["out"], s["lse"], md.partial_o, md.partial_lse, scale, 1.0, md.num_splits,
                              md.split_blocks, (64, 8, 5, 64, False), 8, STAGES=md.num_stages, BLOCK_H=64,
                              BLOCK_N=64, **({"launch_pdl": True} if pdl_decode else {}))
            finally:
                dmod.launch_combine = orig_combine
        return run

    variants = {"module": (dg.sparse_mla_decode_gluon_kernel, orig_combine, False),
                "pdl combine": (dg.sparse_mla_decode_gluon_kernel, combine_pdl, False),
                "+ signal": (signal_mod.sparse_mla_decode_gluon_kernel, combine_pdl, False),
                "pdl both": (wait_mod.sparse_mla_decode_gluon_kernel, combine_pdl, True)}
    for B, q_len, H in SHAPES:
        md = plan_decode(B, q_len, H, TOP_K, "cuda")
        if not md.gluon or md.num_splits == 1:
            print(f"B={B} q{q_len} H={H}: plan is not a split Gluon plan ({md}), skipped")
            continue
        kv = _cache(max(B, 8))
        sets = _sets(B, q_len, H, kv.shape[0] * PAGE)
        for s in sets:
            s["lse"] = torch.empty(B * q_len * H, device="cuda")
        outs = {}
        for name, (kernel, combine, pdl_decode) in variants.items():
            s0 = sets[0]
            s0["out"].fill_(float("nan"))
            call(s0, kv, md, kernel, combine, pdl_decode)()
            torch.cuda.synchronize()
            outs[name] = (s0["out"].clone(), s0["lse"].clone())
        same = {k: torch.equal(v[0], outs["module"][0]) and torch.equal(v[1], outs["module"][1])
                for k, v in outs.items()}
        cases = {name: [call(s, kv, md, *v) for s in sets] for name, v in variants.items()}
        t = time_interleaved(cases, iters=args.iters)
        print(f"B={B} q{q_len} H={H} (splits={md.num_splits} x {md.split_blocks} blocks): "
              + "  ".join(f"{k} {v:.1f} us" if isinstance(v, float) else f"{k} {type(v).__name__}: {v}"[:120]
                          for k, v in t.items())
              + f"  bit-identical: {all(same.values())}", flush=True)
        del kv, sets, cases
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
