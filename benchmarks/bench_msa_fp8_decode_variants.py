"""MSA fp8 decode at the bar shape on the H200: the transposed kernel's variants
(``sparse_decode.DECODE_VARIANT``) and where the time goes (pre-kernel, decode kernel, fixed cost).

    python benchmarks/bench_msa_fp8_decode_variants.py [--sel 16] [--quick]

Shape: B = 128, q_len 1, 64K context, 64 query / 4 KV heads, d 128, NHD paged cache (page =
block = 128), ``--sel`` selected blocks per token and KV head (random + the own block): 16 by
default, ``bench_msa_attention``'s decode inputs (its bar row, 268 MB of selected fp8 K/V; the
same generator, seed and construction), 17 for the earlier probes (285 MB). Every case calls
``sparse_attention`` as ``bench_msa_attention`` does (automatic split). The cases are timed
interleaved (CUDA-graph replays, ``time_interleaved``);
``%copy`` is the selected-bytes rate over the copy rate of ``measure_ceilings`` (1 GiB
``copy_``, read + write, timed alone before the cases; a copy inside the interleaved graphs
read low). Full-op cases are checked against an fp32 torch reference over all tokens with the
GPU tests' tolerances (``TOL``: out 3e-2 abs + rel for fp8, 2e-2 bf16; lse 1e-4 abs + 5e-4 rel
for fp8, 1e-4 bf16) and show the
decode kernel's registers / spills / shared memory of the GPU compile. Diagnostic rows
(``kernel only``): the decode kernel alone on the pre-kernel's output, the pre-kernel alone,
and the decode kernel with empty block lists (launch + prologue + epilogue).
"""

from __future__ import annotations

import argparse

import torch

from mate.ops.msa import sparse_attention as sa
from mate.ops.msa import sparse_decode as sd
from mate.testing.bench import time_fn, time_interleaved

HQ, HKV, D, BLK = 64, 4, 128, 128
SEL = 16
TOL = {torch.bfloat16: 2e-2, torch.float8_e4m3fn: 3e-2}

FP8_CASES = {
    "default": {},
    "direct (cap 128)": {"fp8_direct": True},
    "direct lsum": {"fp8_direct": True, "fp8_lsum": True},
    "direct kvh_fast": {"fp8_direct": True, "fp8_kvh_fast": True},
    "direct lsum kvh_fast": {"fp8_direct": True, "fp8_lsum": True, "fp8_kvh_fast": True},
    "direct 2 stages": {"fp8_direct": True, "fp8_stages": 2},
    "direct 4 stages": {"fp8_direct": True, "fp8_stages": 4},
    "kvh_fast": {"fp8_kvh_fast": True},
}
BF16_CASES = {"default": {}, "direct": {"direct": True}, "direct kvh_fast": {"direct": True, "kvh_fast": True}}
QUICK_FP8 = ("default", "direct (cap 128)", "direct lsum", "direct kvh_fast")


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **kw: None


class _Recorder:
    """Launches the decode kernel and keeps the compiled kernel of the last launch."""

    def __init__(self, kernel):
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid):
        def launch(*a, **kw):
            self.last = self.kernel[grid](*a, **kw)
        return launch


def copy_gbps() -> float:
    """``measure_ceilings``' copy: 1 GiB ``copy_`` timed alone with events (read + write)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), iters=20, use_graph=False)
    return 2 * (1 << 30) / (t * 1e-6) / 1e9


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


def reference(pb: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 softmax(q kᵀ / sqrt(d)) v and its natural-log LSE over the selected blocks."""
    q, k, v, idx, table = pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    B = q.shape[0]
    pg = torch.gather(table, 1, idx.view(B, -1).long()).view(B, HKV, SEL).long()
    heads = torch.arange(HKV, device="cuda")[None, :, None]
    kk = k[pg, :, heads].float().reshape(B, HKV, SEL * BLK, D)
    vv = v[pg, :, heads].float().reshape(B, HKV, SEL * BLK, D)
    qq = q.float().view(B, HKV, HQ // HKV, D)
    s = torch.einsum("bgrd,bgkd->bgrk", qq, kk) * D ** -0.5
    o = torch.einsum("bgrk,bgkd->bgrd", s.softmax(-1), vv).reshape(B, HQ, D)
    return o, torch.logsumexp(s, -1).reshape(B, HQ)


def run_dtype(dtype: torch.dtype, cases: dict, copy_rate: float, B: int = 128, ctx: int = 65536,
              diagnostics: bool = True) -> None:
    from mate.ops.msa.sparse_attention import sparse_attention

    pb = problem(B, ctx, dtype)
    ref_o, ref_l = reference(pb)
    out = torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, HQ, device="cuda")
    nbytes = 2.0 * B * HKV * SEL * BLK * D * pb["k"].element_size()
    base = dict(sd.DECODE_VARIANT)
    fp8 = dtype == torch.float8_e4m3fn

    def restore():
        sd.DECODE_VARIANT.clear()
        sd.DECODE_VARIANT.update(base)

    def full(over: dict, rec=None):
        """The whole op as ``bench_msa_attention`` calls it, with ``over`` applied while it launches."""
        def fn():
            sd.DECODE_VARIANT.update(over)
            decode = sd.msa_decode_t_kernel
            if rec is not None:
                sd.msa_decode_t_kernel = rec
            try:
                sparse_attention(pb["q"], pb["k"], pb["v"], kv_block_indexes=pb["kv_block_indexes"],
                                 page_table=pb["page_table"], qo_indptr=pb["qo_indptr"], kv_lens=pb["kv_lens"],
                                 out=out, lse=lse, causal=True, decode=True, num_kv_splits=-1, num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = decode
                restore()
        return fn

    fns, notes = {}, {}
    for name, over in cases.items():
        rec = _Recorder(sd.msa_decode_t_kernel)
        try:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            full(over, rec)()
            torch.cuda.synchronize()
            tol = TOL[dtype]
            err = (out.float() - ref_o).abs()
            ok = bool((err <= tol + tol * ref_o.abs()).all())  # NaN fails
            lerr = (lse - ref_l).abs()
            ok = ok and bool((lerr <= 1e-4 + (5e-4 if fp8 else 1e-4) * ref_l.abs()).all())
            sd.DECODE_VARIANT.update(over)
            splits = sa.resolve_num_splits(-1, B, HQ, HKV, SEL, True, out.device, fp8)
            keys, stages, cap = sd.t_config(fp8)
            info = f"{keys} keys {stages} st cap {cap}, splits {splits}, {sd.t_programs_per_sm(fp8)}/SM (model)"
            restore()
            kern = rec.last
            if kern is not None:
                info += f", {kern.n_regs} regs {kern.n_spills} spills {kern.metadata.shared // 1024} KB"
            notes[name] = f"err {err.max().item():.1e} lse {lerr.max().item():.1e} {'ok' if ok else 'FAIL'} / {info}"
            fns[name] = full(over)
        except Exception as exc:
            restore()
            notes[name] = f"failed: {type(exc).__name__}: {exc}"[:200]
        print(f"  checked {name}: {notes[name]}", flush=True)
    if diagnostics:  # the default's kernels alone (sparse_attention_triton on a kept workspace)
        n_int, n_flt = sa.workspace_numel(B, HQ, HKV, SEL, True, -1, out.device)
        iws = torch.zeros(n_int, dtype=torch.int32, device="cuda")
        iws_empty = torch.zeros_like(iws)
        fws = torch.empty(max(n_flt, 1), dtype=torch.float32, device="cuda")

        def part(ws: torch.Tensor, skip_union: bool = False, skip_decode: bool = False):
            def fn():
                union, decode = sa._msa_union_kernel, sd.msa_decode_t_kernel
                if skip_union:
                    sa._msa_union_kernel = _NoLaunch()
                if skip_decode:
                    sd.msa_decode_t_kernel = _NoLaunch()
                try:
                    sa.sparse_attention_triton(
                        pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["qo_indptr"], pb["kv_lens"], None,
                        pb["page_table"], None, None, out, lse, layout="NHD", sm_scale=D ** -0.5, k_scale=1.0,
                        v_scale=1.0, causal=True, decode=True, num_splits=-1, iws=ws, fws=fws)
                finally:
                    sa._msa_union_kernel, sd.msa_decode_t_kernel = union, decode
            return fn

        part(iws)()
        part(iws_empty)()
        torch.cuda.synchronize()
        n_u = B * HKV * sa.SparseTiling(HQ // HKV, SEL, True).capacity
        iws_empty[3 * n_u:3 * n_u + B * HKV].zero_()  # u_cnt: no entries
        fns.update({"kernel only: decode (default)": part(iws, skip_union=True),
                    "kernel only: union pre-kernel": part(iws, skip_decode=True),
                    "kernel only: decode, empty lists": part(iws_empty, skip_union=True)})
    times = time_interleaved(fns, rounds=5, iters=50)
    tag = "fp8" if fp8 else "bf16"
    print(f"--- {tag}: B={B} ctx={ctx} Hq={HQ} Hkv={HKV} {SEL} blocks, {nbytes / 1e6:.1f} MB selected K/V; "
          f"copy {copy_rate:.0f} GB/s; 90% bar {nbytes / (0.9 * copy_rate * 1e3):.1f} us")
    print(f"{'case':36s} {'us':>8s} {'GB/s':>8s} {'%copy':>6s}  check / config, splits, programs per SM")
    for name in fns:
        t = times.get(name)
        if isinstance(t, float):
            gbps = nbytes / (t * 1e-6) / 1e9
            print(f"{name:36s} {t:8.1f} {gbps:8.0f} {100 * gbps / copy_rate:6.1f}  {notes.get(name, '')}")
        else:
            print(f"{name:36s} {'-':>8s} {'-':>8s} {'-':>6s}  {notes.get(name)} {t if t else ''}")


def main() -> None:
    global SEL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sel", type=int, default=SEL, help="selected blocks per token and KV head (own block included)")
    ap.add_argument("--quick", action="store_true", help="fp8: the default and three direct cases, no diagnostics")
    ap.add_argument("--no-bf16", action="store_true")
    args = ap.parse_args()
    SEL = args.sel
    print(torch.cuda.get_device_name(), flush=True)
    fp8_cases = {k: v for k, v in FP8_CASES.items() if not args.quick or k in QUICK_FP8}
    jobs = [(torch.float8_e4m3fn, fp8_cases)] + ([] if args.no_bf16 else [(torch.bfloat16, BF16_CASES)])
    for dtype, cases in jobs:
        rate = copy_gbps()
        torch.cuda.empty_cache()
        print(f"copy (measure_ceilings' 1 GiB copy_, alone): {rate:.0f} GB/s", flush=True)
        run_dtype(dtype, cases, rate, diagnostics=not args.quick)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
