"""Probe: host (CPU) time of one eager call of the public ops.

A serving engine runs prefill, and any step it does not capture in a CUDA graph, eagerly:
each call's Python work (validation, allocation, dispatch, Triton's launcher) is host time
the GPU waits for whenever the kernel is shorter. This times ``calls`` back-to-back calls of
each op while the GPU is held busy by a spin kernel (so no launch blocks), with the eager
calls going straight to the implementation (``mate._core.custom_op.EAGER_DIRECT``, the
default) and through the ``torch.library`` dispatcher, and prints the functions with the
most own time (cProfile) of the direct path.

    python benchmarks/probe_host_overhead.py [--profile]
"""

from __future__ import annotations

import cProfile
import functools
import math
import pstats
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

import mate._core.custom_op as co
from mate import gemm
from mate.mha_interface import flash_attn_varlen_func, flash_attn_with_kvcache
from mate.sparse_mla_interface import get_batch_decode_metadata_mla, sparse_mla_fp8_decode
from mate.testing import rand_fp8


def _host_us(fn, calls: int = 20, reps: int = 7) -> float:
    """Median host microseconds per call over ``reps`` batches of ``calls`` calls, each batch
    enqueued behind a GPU spin long enough that no launch waits for the GPU."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU spin
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(per)


def _cases() -> dict:
    dev = "cuda"
    torch.manual_seed(0)
    cases = {}
    # dense ragged prefill, 8 x 2048, 32 query / 8 KV heads
    T, H, HKV, D = 16384, 32, 8, 128
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(T, HKV, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.arange(0, T + 1, 2048, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    cases["flash_attn_varlen_func 8x2048 32/8"] = lambda: flash_attn_varlen_func(q, k, v, cu, cu, 2048, 2048,
                                                                                 causal=True, out=out)
    # paged decode, B 64, 4K context, page 64
    B, ctx, ps = 64, 4096, 64
    qd = torch.randn(B, 1, H, D, device=dev, dtype=torch.bfloat16)
    kc, vc = (torch.randn(B * ctx // ps, ps, HKV, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    pt = torch.arange(B * ctx // ps, dtype=torch.int32, device=dev).view(B, -1)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    cases["flash_attn_with_kvcache B64 4K"] = lambda: flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                                                             page_table=pt, causal=True)
    # groupwise FP8 GEMM at a decode shape
    m, n, kk = 64, 4096, 7168
    a, b = rand_fp8((m, kk), dev), rand_fp8((n, kk), dev)
    sa = torch.rand(kk // 128, m, device=dev) + 0.5
    sb = torch.rand(kk // 128, n // 128, device=dev) + 0.5
    gout = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    cases["gemm_fp8_nt_groupwise 64x4096x7168"] = lambda: gemm.gemm_fp8_nt_groupwise(
        a, b, sa, sb, scale_major_mode="MN", out=gout)
    A, Bm = rand_fp8((4, 64, 512), dev), rand_fp8((4, 1024, 512), dev).transpose(1, 2)
    one = torch.ones((), device=dev)
    cases["bmm_fp8 4x64x512x1024"] = lambda: gemm.bmm_fp8(A, Bm, one, one, torch.bfloat16)
    cases["sparse_mla_fp8_decode B64 H128"] = sparse_mla_decode_call(64, 128)
    return cases


def sparse_mla_decode_call(batch: int, heads: int, with_out: bool = False, with_metadata: bool = True):
    """An eager sparse_mla_fp8_decode call with prepared metadata (none when not
    ``with_metadata``): ``batch`` queries of ``heads`` heads, top-k 2048 rows of a paged FP8
    cache (pages of 64), ``out`` given when ``with_out``."""
    dev, top_k, page = "cuda", 2048, 64
    query = rand_fp8((batch, 1, heads, 576), dev)
    pages = batch * 4 * top_k // page
    cache = rand_fp8((pages, page, 576), dev)
    bt = torch.randint(0, pages * page, (batch, 1, top_k), dtype=torch.int32, device=dev)
    sl = torch.full((batch,), top_k, dtype=torch.int32, device=dev)
    meta = get_batch_decode_metadata_mla(query, sl, top_k) if with_metadata else None
    out = torch.empty(batch, 1, heads, 512, dtype=torch.bfloat16, device=dev) if with_out else None
    return functools.partial(sparse_mla_fp8_decode, query, cache, None, 128, 512, 64, bt, sl, 4 * top_k,
                             sparse_mla_top_k=top_k, bmm1_scale=1 / math.sqrt(192), bmm2_scale=1.0, out=out,
                             metadata=meta)


@triton.jit
def _touch(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _references() -> dict:
    """Host floors on the same machine: a bare Triton launch and aten's FA2 varlen op."""
    x = torch.zeros(64, device="cuda")
    T, H, HKV, D = 16384, 32, 8, 128
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = torch.arange(0, T + 1, 2048, dtype=torch.int32, device="cuda")
    return {"(floor) bare Triton launch, 2 args": lambda: _touch[(1,)](x, 64, BLOCK=64),
            "(peer) aten FA2 varlen 8x2048 32/8": lambda: torch.ops.aten._flash_attention_forward(
                q, k, v, cu, cu, 2048, 2048, 0.0, True, False, scale=D ** -0.5)}


def _profile(fn, top: int = 10) -> None:
    torch.cuda._sleep(100_000_000)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, func), (_, calls, tt, ct, _) in rows:
        where = f"{file.split('site-packages/')[-1].split('/work/main/')[-1]}:{line}({func})"
        print(f"    own {tt * 1e6 / 20:7.1f} us/call  cum {ct * 1e6 / 20:7.1f}  x{calls // 20:<3d} {where}"[:150])


def main() -> None:
    profile = "--profile" in sys.argv
    cases = {**_references(), **_cases()}
    print(f"{'op':42s} {'direct (us)':>12s} {'dispatcher (us)':>16s}  (median of 5 alternating runs)")
    for name, fn in cases.items():
        res = {True: [], False: []}
        for _ in range(5):
            for direct in (True, False):
                co.EAGER_DIRECT = direct
                try:
                    res[direct].append(_host_us(fn, reps=3))
                except Exception as exc:
                    res[direct] = f"{type(exc).__name__}: {exc}"[:60]
                    break
        co.EAGER_DIRECT = True
        cells = [f"{statistics.median(r):.1f}" if isinstance(r, list) and r else str(r) for r in res.values()]
        print(f"{name:42s} {cells[0]:>12s} {cells[1]:>16s}", flush=True)
        if profile and not name.startswith("("):
            _profile(fn)


if __name__ == "__main__":
    main()
