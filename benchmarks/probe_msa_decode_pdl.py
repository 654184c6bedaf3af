"""Probe (session 25): the MSA decode at the bar shape timed as a layer loop (several calls per
CUDA-graph replay) and with programmatic dependent launch (PDL) between consecutive calls.

    python benchmarks/probe_msa_decode_pdl.py            # H200: interleaved A/B
    python benchmarks/probe_msa_decode_pdl.py --compile  # CPU: sm_90 build of the patched kernel

Why: the bar's row times one decode per graph replay, so each time carries a launch's fixed
cost (a null kernel of the same grid: 3.1 us, 4.6% of the fp8 decode) that the 1 GiB copy of
the ceiling spreads over 2 GiB. A serving engine runs the decode once per layer inside one
graph; FlashInfer's ``bench_gpu_time_with_cudagraph`` times such loops (10 calls per graph).
``8 calls`` replays eight decodes back to back, alternating two selections of the same cache
(no L2 reuse between neighbours), and divides by 8. ``8 calls pdl`` launches a patched copy
of the kernel with ``launch_pdl=True`` that executes ``griddepcontrol.wait`` before anything
else (so it reads nothing before its predecessor is complete: the results cannot change; the
probe checks them bit for bit) and ``griddepcontrol.launch_dependents`` right after, so the
next call's programs are resident on the SMs this one leaves idle as it ends.

Cases: the fp8 and bf16 token-major (NHD) caches and the fp8 head-major (HND) copy of the bar
inputs (``bench_msa_attention.decode_inputs``), a null Triton kernel with the decode's grid,
and the copy ceiling (1 GiB, events, as ``measure_ceilings``) beside a graph of 8 copies of
the selected bytes' size.

H200, session 25 (``benchmarks/results/2026-11-30-h200-s25-probes.txt``, copy 4237 GB/s; us, one
call / 8 calls / 8 calls with PDL; outputs bit-identical): fp8 NHD 73.4 / 71.2 / 70.9 (86.3 / 89.0
/ 89.4% of copy), fp8 HND 72.0 / 69.4 / 69.2 (88.0 / 91.3 / 91.5%), bf16 NHD 129.7 / 127.9 /
126.5 (97.7 / 99.1 / 100.2%); null kernel 3.0 alone, 1.2 per call in 8 (PDL 1.3); the 134 MB
copy 4020 GB/s alone, 4141 in 8. The layer loop is now how ``bench_msa_attention`` times the
decode; PDL (0.2-0.3 us fp8) is not adopted: everything the kernel does first depends on its
predecessor's output.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from patched_source import apply_edits, import_source  # noqa: E402

from mate.ops.msa import sparse_decode as sd  # noqa: E402

START = "    t = tl.program_id(0)  # grid (tokens, KV heads, splits)\n"


def pdl_module():
    """``sparse_decode.py`` whose decode kernel waits for its predecessor, then signals."""
    src = apply_edits(inspect.getsource(sd),
                      [(START, "    tl.extra.cuda.gdc_wait()\n    tl.extra.cuda.gdc_launch_dependents()\n" + START)])
    return import_source("mate_msa_decode_pdl", src)


class _Launch:
    """Stands in for ``sparse_decode.msa_decode_t_kernel`` in the launcher: ``kernel`` with extra
    launch options."""

    def __init__(self, kernel, **opts):
        self.kernel, self.opts = kernel, opts

    def __getitem__(self, grid):
        def launch(*a, **kw):
            return self.kernel[grid](*a, **kw, **self.opts)
        return launch


@triton.jit
def _null_kernel(x_ptr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)


def compile_only() -> int:
    from compile_msa_decode import ALIGNED, signature
    from triton.compiler import ASTSource

    from mate.testing.sass import compile_sm90, divisibility_attrs

    mod = pdl_module()
    v_mma = sd.t_constexprs(True)["V_MMA"]
    sig = signature("fp8e4nv", "NHD", "bf16", True, 64, v_mma)
    cx = {"GP": 16, "C": 16, "HEAD_DIM": 128, "NUM_SPLITS": 1, "CAUSAL": True, "IS_FP8": True, "HEAD_MAJOR": False,
          "FLAT": True, "KEYS": 64, "BLOCK_W": 16, "USE_PAGE_TABLE": True, "HAS_QO_OFFSET": False, "LAZY": 8,
          "stride_lh": 1, "V_MMA": v_mma}
    sig.update({k: "constexpr" for k in cx})
    ok = True
    for name, fn in (("module", sd.msa_decode_t_kernel), ("pdl", mod.msa_decode_t_kernel)):
        rep = compile_sm90(ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=divisibility_attrs(sig, ALIGNED)),
                           {"num_warps": 4, "num_stages": 3, "maxnreg": 128, "launch_pdl": name == "pdl"})
        ptx = rep.kernel.asm["ptx"]
        n_sig, n_wait = ptx.count("griddepcontrol.launch_dependents"), ptx.count("griddepcontrol.wait")
        print(f"{name}: {rep.registers} registers, {rep.spills} spills, signal {n_sig}, wait {n_wait}")
        ok &= (n_sig, n_wait) == ((1, 1) if name == "pdl" else (0, 0))
    return 0 if ok else 1


def run_layout(dtype, layout: str, launches: dict, plain, copy: float, iters: int) -> None:
    """Times 1 and 8 decodes per replay for each of ``launches`` (name -> stand-in for the
    kernel; "" the plain one) on one cache dtype and layout."""
    import torch
    from bench_msa_attention import BLK, HKV, HQ, TOPK, D, decode_inputs, decode_selection

    from mate.ops.msa.sparse_attention import sparse_attention
    from mate.testing.bench import time_interleaved

    pb = decode_inputs(128, 65536, dtype)
    B = 128
    nb = 65536 // BLK
    g = torch.Generator(device="cuda").manual_seed(2)
    idx2 = decode_selection(torch.rand(B, HKV, nb - 1, device="cuda", generator=g), TOPK)
    k, v = pb["k"], pb["v"]
    if layout == "HND":
        k, v = (x.permute(0, 2, 1, 3).contiguous() for x in (k, v))
        pb["k"] = pb["v"] = None
    nbytes = 2.0 * B * HKV * TOPK * BLK * D * k.element_size()
    outs = [torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    lses = [torch.empty(B, HQ, device="cuda") for _ in range(2)]

    def call(which: int, pdl: str):
        idx = pb["kv_block_indexes"] if which == 0 else idx2

        def run():
            sd.msa_decode_t_kernel = launches[pdl]
            try:
                sparse_attention(pb["q"], k, v, kv_block_indexes=idx, page_table=pb["page_table"],
                                 qo_indptr=pb["qo_indptr"], kv_lens=pb["kv_lens"], out=outs[which],
                                 lse=lses[which], causal=True, decode=True, num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = plain
        return run

    res = {}
    for pdl in launches:
        for o in outs:
            o.fill_(float("nan"))
        call(0, pdl)()
        call(1, pdl)()
        torch.cuda.synchronize()
        res[pdl] = [x.clone() for x in outs + lses]
    same = {name.strip(): all(torch.equal(a, b) for a, b in zip(res[""], res[name])) for name in launches if name}
    cases = {}
    for pdl in launches:
        cases["1 call" + pdl] = [call(0, pdl)]
        cases["8 calls" + pdl] = [call(i % 2, pdl) for i in range(8)]
    times = time_interleaved(cases, iters=iters)
    tag = f"{'fp8' if dtype != torch.bfloat16 else 'bf16'} {layout}"
    print(f"--- {tag}: {nbytes / 1e6:.1f} MB selected, outputs bit-identical to the plain launch: {same}")
    for name, t_us in times.items():
        if isinstance(t_us, Exception):
            print(f"  {name:16s} failed: {t_us}"[:300])
        else:
            print(f"  {name:16s} {t_us:6.1f} us  {nbytes / (t_us * 1e-6) / 1e9:6.0f} GB/s  "
                  f"{100 * nbytes / (t_us * 1e-6) / 1e9 / copy:5.1f}% of copy", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="sm_90 build only (CPU)")
    ap.add_argument("--iters", type=int, default=60)
    args = ap.parse_args()
    if args.compile:
        return compile_only()

    import torch

    from mate.testing.bench import time_fn, time_interleaved

    mod = pdl_module()
    plain = sd.msa_decode_t_kernel
    launches = {"": _Launch(plain), " pdl": _Launch(mod.msa_decode_t_kernel, launch_pdl=True)}

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), iters=20, use_graph=False)
    copy = 2 * (1 << 30) / (t * 1e-6) / 1e9
    print(f"copy 1 GiB (events, measure_ceilings): {copy:.0f} GB/s", flush=True)

    for dtype, layout in ((torch.float8_e4m3fn, "NHD"), (torch.float8_e4m3fn, "HND"), (torch.bfloat16, "NHD")):
        run_layout(dtype, layout, launches, plain, copy, args.iters)
        torch.cuda.empty_cache()

    x = torch.zeros(1, device="cuda")
    n268 = 268_435_456 // 2
    s2, d2 = src[:n268], dst[:n268]
    cases = {"null 1": [lambda: _null_kernel[(128, 4, 1)](x, PDL=False)],
             "null 8": [lambda: _null_kernel[(128, 4, 1)](x, PDL=False)] * 8,
             "null 8 pdl": [lambda: _null_kernel[(128, 4, 1)](x, PDL=True, launch_pdl=True)] * 8,
             "copy 268 MB x1": [lambda: d2.copy_(s2)],
             "copy 268 MB x8": [lambda: d2.copy_(s2)] * 8}
    times = time_interleaved(cases, iters=args.iters)
    print("--- fixed cost and copy (268 MB = read + write bytes of the copy)")
    for name, t_us in times.items():
        extra = f"  {2 * n268 / (t_us * 1e-6) / 1e9:6.0f} GB/s" if name.startswith("copy") else ""
        print(f"  {name:16s} {t_us:6.1f} us{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
