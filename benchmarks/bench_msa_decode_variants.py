"""MSA sparse decode variants on the H200 at the bar shape: the default kernels against the
Gluon fp8 kernel (``sparse_decode_gluon.py``) in its configurations.

    python benchmarks/bench_msa_decode_variants.py [--quick]

Shape: B = 128 requests, q_len 1, 64K context, 64 query heads, 4 KV heads, head_dim 128,
NHD paged cache (page = block = 128 tokens), 17 selected blocks per token and KV head (16
from a random ranking + the token's own block). GB/s count the selected K and V bytes once;
``%copy`` divides them by the measured copy bandwidth (read + write, as
``mate.testing.bench.measure_ceilings``). Each case is checked against an fp32 torch
reference over all tokens: ``maxerr`` is max |out - ref| (outputs are at most ~0.05 here) and
``ok`` whether every element is within 4e-3 * max|ref| + 1e-2 * |ref| (a few bf16 ulps; a
wrong row permutation or a lost tile is off by the output's own size). The cases of one dtype are timed interleaved
(CUDA-graph replays, same clocks).
"""

from __future__ import annotations

import argparse

import torch

from mate.ops.msa import sparse_decode as sd
from mate.ops.msa import sparse_decode_gluon as sg
from mate.ops.msa.sparse_attention import resolve_num_splits, sparse_attention
from mate.testing.bench import time_fn, time_interleaved

HQ, HKV, D, BLK, SEL = 64, 4, 128, 128, 17

# name: DECODE_VARIANT overrides, num_kv_splits
G = {"fp8_gluon": True}
FP8_CASES = {
    "default (triton transposed)": ({}, -1),
    "gluon k64 s3": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 3}, -1),
    "gluon k64 s2": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 2}, -1),
    "gluon k128 s2 auto-split": ({**G, "fp8_gluon_keys": 128, "fp8_gluon_stages": 2}, -1),
    "gluon ws k64 s3": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 3, "fp8_gluon_ws": True}, -1),
    "gluon ws k64 s4 auto-split": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 4, "fp8_gluon_ws": True}, -1),
    "gluon overlap k64 s3": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 3, "fp8_gluon_overlap": True}, -1),
    "gluon overlap k64 s2": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 2, "fp8_gluon_overlap": True}, -1),
    "gluon overlap k64 s4 auto-split": ({**G, "fp8_gluon_keys": 64, "fp8_gluon_stages": 4,
                                         "fp8_gluon_overlap": True}, -1),
}
"""All with the automatic split (1 where 4 programs fit an SM: 512 programs, one wave; 3 for
the configurations with 3 programs per SM)."""
BF16_CASES = {"default (triton transposed)": ({}, -1)}


def copy_gbps() -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), iters=20, use_graph=False)
    return 2 * n / (t * 1e-6) / 1e9


def problem(B: int, ctx: int, dtype: torch.dtype) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    nb = ctx // BLK
    pages = B * nb
    k = (torch.randn(pages, BLK, HKV, D, device="cuda", generator=g) * 0.5).to(dtype)
    v = (torch.randn(pages, BLK, HKV, D, device="cuda", generator=g) * 0.5).to(dtype)
    table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(B, nb).contiguous()
    scores = torch.rand(B, HKV, nb - 1, device="cuda", generator=g)
    idx = torch.cat([scores.topk(SEL - 1, -1).indices, torch.full((B, HKV, 1), nb - 1, device="cuda")],
                    -1).to(torch.int32).contiguous()
    q = (torch.randn(B, HQ, D, device="cuda", generator=g) * 0.5).to(dtype)
    return dict(q=q, k=k, v=v, kv_block_indexes=idx, page_table=table,
                qo_indptr=torch.arange(B + 1, dtype=torch.int32, device="cuda"),
                kv_lens=torch.full((B,), ctx, dtype=torch.int32, device="cuda"))


def reference(pb: dict) -> torch.Tensor:
    """fp32 softmax(q kᵀ / sqrt(d)) v over the selected blocks (all keys visible)."""
    q, k, v, idx, table = pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    B = q.shape[0]
    pg = torch.gather(table, 1, idx.view(B, -1).long()).view(B, HKV, SEL).long()
    heads = torch.arange(HKV, device="cuda")[None, :, None]
    kk = k[pg, :, heads].float().reshape(B, HKV, SEL * BLK, D)
    vv = v[pg, :, heads].float().reshape(B, HKV, SEL * BLK, D)
    qq = q.float().view(B, HKV, HQ // HKV, D)
    s = torch.einsum("bgrd,bgkd->bgrk", qq, kk) * D ** -0.5
    return torch.einsum("bgrk,bgkd->bgrd", s.softmax(-1), vv).reshape(B, HQ, D)


def run_dtype(dtype: torch.dtype, cases: dict, copy: float, B: int, ctx: int) -> None:
    pb = problem(B, ctx, dtype)
    ref = reference(pb)
    out = torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, HQ, device="cuda")
    nbytes = 2.0 * B * HKV * SEL * BLK * D * pb["k"].element_size()
    base = dict(sd.DECODE_VARIANT)
    errors: dict[str, str] = {}

    def call(over: dict, splits: int):
        def fn():
            sd.DECODE_VARIANT.clear()
            sd.DECODE_VARIANT.update(base, **over)
            try:
                sparse_attention(**pb, out=out, lse=lse, causal=True, decode=True, num_kv_splits=splits,
                                 num_kv_heads=HKV)
            finally:
                sd.DECODE_VARIANT.clear()
                sd.DECODE_VARIANT.update(base)
        return fn

    fns = {}
    launches = []
    launch = sg.msa_decode_gluon

    def counted(*a, **kw):
        launches.append(a[-5:])
        return launch(*a, **kw)

    sg.msa_decode_gluon = counted
    for name, (over, splits) in cases.items():
        fn = call(over, splits)
        try:
            out.fill_(float("nan"))
            launches.clear()
            fn()
            torch.cuda.synchronize()
            if bool(over.get("fp8_gluon")) != bool(launches):
                raise RuntimeError(f"gluon kernel launched {len(launches)} times")
            err = (out.float() - ref).abs()
            ok = bool((err <= 4e-3 * ref.abs().max() + 1e-2 * ref.abs()).all())  # NaN fails
            sd.DECODE_VARIANT.update(over)
            fp8 = dtype == torch.float8_e4m3fn
            split_info = (f"splits {resolve_num_splits(splits, B, HQ, HKV, SEL, True, out.device, fp8)}, "
                          f"{sd.t_programs_per_sm(fp8)}/SM")
            sd.DECODE_VARIANT.clear()
            sd.DECODE_VARIANT.update(base)
            errors[name] = f"{err.max().item():.2e} {'ok' if ok else 'FAIL'} / {split_info}"
            fns[name] = fn
        except Exception as exc:
            errors[name] = f"failed: {type(exc).__name__}: {exc}"[:200]
        print(f"  checked {name}: {errors[name]}")  # before timing: survives a later hang
    sg.msa_decode_gluon = launch
    times = time_interleaved(fns, rounds=5, iters=50) if fns else {}
    tag = "fp8" if dtype == torch.float8_e4m3fn else "bf16"
    print(f"--- {tag}: B={B} ctx={ctx} Hq={HQ} Hkv={HKV} {SEL} blocks, {nbytes / 1e6:.1f} MB selected K/V")
    print(f"{'case':32s} {'us':>8s} {'GB/s':>8s} {'%copy':>6s}  maxerr / splits, programs per SM")
    for name in cases:
        t = times.get(name)
        if isinstance(t, float):
            gbps = nbytes / (t * 1e-6) / 1e9
            print(f"{name:32s} {t:8.1f} {gbps:8.0f} {100 * gbps / copy:6.1f}  {errors[name]}")
        else:
            print(f"{name:32s} {'-':>8s} {'-':>8s} {'-':>6s}  {errors.get(name)} {t if t else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B=32 instead of 128")
    args = ap.parse_args()
    B, ctx = (32, 65536) if args.quick else (128, 65536)
    copy = copy_gbps()
    print(f"copy bandwidth (read + write): {copy:.0f} GB/s; H200 {torch.cuda.get_device_name()}")
    for dtype, cases in ((torch.float8_e4m3fn, FP8_CASES), (torch.bfloat16, BF16_CASES)):
        run_dtype(dtype, cases, copy, B, ctx)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
