"""MSA decode at the bar shape on the H200: the transposed kernel's default
(``sparse_decode.DECODE_VARIANT``) against what remains selectable, and its fixed cost.

    python benchmarks/bench_msa_fp8_decode_variants.py [--sel 16] [--quick]

Shape: B = 128, q_len 1, 64K context, 64 query / 4 KV heads, d 128, NHD paged cache (page =
block = 128), ``--sel`` selected blocks per token and KV head (random + the own block): 16 by
default, ``bench_msa_attention``'s decode inputs (its bar row, 268 MB of selected fp8 K/V; the
same generator, seed and construction), 17 for the earlier probes (285 MB). Every case calls
``sparse_attention`` as ``bench_msa_attention`` does (automatic split unless the case names
one). Cases: the default (fp8 capped at 128 registers; lazy rescale 8: ``DECODE_VARIANT``'s
``lazy`` / ``fp8_lazy``, reference max kept until a logit exceeds it by 8, per-key sums),
``lazy 0`` (the softmax rescaled every tile), fp8 uncapped (3 programs per SM), 2 splits
(each split's program builds the whole list), the "heads" kernel (after the
``_msa_union_kernel`` pre-kernel), ``V gathered`` (e4m3 V gathered and widened in registers
instead of the identity wgmma), and ``default again``: the default timed a second time in
the same run, whose distance to ``default`` is the run's noise floor (session 19 saw identical
cases up to 0.6 us apart here and 2.8 us at the small-H sparse MLA bar shape); ``--cases``
picks some by name.
The cases are timed interleaved (CUDA-graph replays, ``time_interleaved``); ``%copy`` is the
selected-bytes rate over the copy rate of ``measure_ceilings`` (1 GiB ``copy_``, read + write,
timed alone before the cases; a copy inside the interleaved graphs read low). Cases are checked
against an fp32 torch reference over all tokens with the GPU tests' tolerances (``TOL``: out
3e-2 abs + rel for fp8, 2e-2 bf16; lse 1e-4 abs + 5e-4 rel for fp8, 1e-4 bf16) and show the
kernel's registers / spills / shared memory of the GPU compile. Diagnostic rows (``fixed
cost``): the default with every id -1 (launch,
list building, prologue and epilogue; no key block).

H200, session 30 (``--sel 16``; a slow machine state, the copy alone 3819 GB/s): fp8 default (Vᵀ by
the identity wgmma) 84.4 us, ``V gathered`` 84.3, default again 84.5; fixed cost 6.5; bf16 147.3.
H200, Gluon port (``--sel 16``, copy 4262 GB/s): fp8 default 84.8 us, the Gluon port of the
transposed kernel 84.6, with 2 splits 95.5, lazy 4 84.8; fixed cost 5.6 against 7.7 (removed).
H200, lazy (``--sel 16``, copy 4231 GB/s): fp8 lazy 8 85.1 us, lazy 0 86.8, lazy 8 with a
96-register cap 87.8 (removed); fixed cost 5.3; bf16 lazy 8 148.0, lazy 0 149.5.
H200, reg list (``--sel 16``, copy 4263 GB/s, bf16 4042): fp8 default 84.3 us, lazy 0 85.6, reg list
85.5, lazy 0 reg list 87.1 (removed); fixed cost 5.5; bf16 default 148.0, lazy 0 149.5, reg list 148.9.
H200, 2026-11-29 (``--sel 16``, copy 4115 GB/s), before the pre-kernel path, ``lsum`` and
``kvh_fast`` were removed: fp8 pre-kernel 84.8 us, in-kernel list (now the default) 80.2, with
lsum 86.7, kvh_fast 87.6, 2 stages 92.0, 4 stages 98.5; bf16 145.9 against 139.6.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from mate.ops.msa import sparse_attention as sa
from mate.ops.msa import sparse_decode as sd
from mate.testing.bench import time_fn, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_msa_attention import BLK, HKV, HQ, D, decode_inputs  # noqa: E402

SEL = 16
TOL = {torch.bfloat16: 2e-2, torch.float8_e4m3fn: 3e-2}

# name: (DECODE_VARIANT updates, num_kv_splits)
FP8_CASES = {
    "default": ({}, -1),
    "lazy 0": ({"fp8_lazy": 0}, -1),
    "uncapped": ({"fp8_maxnreg": None}, -1),
    "2 splits": ({}, 2),
    "heads kernel": ({"kernel": "heads"}, -1),
    "V gathered": ({"fp8_v": "gather"}, -1),
    "default again": ({}, -1),
}
BF16_CASES = {"default": ({}, -1), "lazy 0": ({"lazy": 0}, -1), "2 splits": ({}, 2),
              "heads kernel": ({"kernel": "heads"}, -1), "default again": ({}, -1)}
QUICK_FP8 = ("default", "uncapped", "default again")


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
    """``bench_msa_attention``'s decode inputs with ``SEL`` selected blocks."""
    return decode_inputs(B, ctx, dtype, SEL)


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

    def full(over: dict, splits: int, rec=None, ids=None):
        """The whole op as ``bench_msa_attention`` calls it, with ``over`` applied while it launches."""
        def fn():
            sd.DECODE_VARIANT.update(over)
            decode = sd.msa_decode_t_kernel
            if rec is not None:
                sd.msa_decode_t_kernel = rec
            try:
                sparse_attention(pb["q"], pb["k"], pb["v"],
                                 kv_block_indexes=pb["kv_block_indexes"] if ids is None else ids,
                                 page_table=pb["page_table"], qo_indptr=pb["qo_indptr"], kv_lens=pb["kv_lens"],
                                 out=out, lse=lse, causal=True, decode=True, num_kv_splits=splits, num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = decode
                restore()
        return fn

    fns, notes = {}, {}
    for name, (over, num_splits) in cases.items():
        rec = _Recorder(sd.msa_decode_t_kernel)
        try:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            full(over, num_splits, rec)()
            torch.cuda.synchronize()
            tol = TOL[dtype]
            err = (out.float() - ref_o).abs()
            ok = bool((err <= tol + tol * ref_o.abs()).all())  # NaN fails
            lerr = (lse - ref_l).abs()
            ok = ok and bool((lerr <= 1e-4 + (5e-4 if fp8 else 1e-4) * ref_l.abs()).all())
            sd.DECODE_VARIANT.update(over)
            splits = sa.resolve_num_splits(num_splits, B, HQ, HKV, SEL, True, out.device, fp8)
            if sd.DECODE_VARIANT["kernel"] == "transposed":
                keys, stages, cap = sd.t_config(fp8)
                info = f"{keys} keys {stages} st cap {cap}, splits {splits}, {sd.t_programs_per_sm(fp8)}/SM (model)"
            else:
                info = f"splits {splits}, {sa.decode_programs_per_sm(fp8)}/SM (model)"
            restore()
            kern = rec.last
            if kern is not None:
                info += f", {kern.n_regs} regs {kern.n_spills} spills {kern.metadata.shared // 1024} KB"
            notes[name] = f"err {err.max().item():.1e} lse {lerr.max().item():.1e} {'ok' if ok else 'FAIL'} / {info}"
            fns[name] = full(over, num_splits)
        except Exception as exc:
            restore()
            notes[name] = f"failed: {type(exc).__name__}: {exc}"[:200]
        print(f"  checked {name}: {notes[name]}", flush=True)
    if diagnostics:
        none = torch.full_like(pb["kv_block_indexes"], -1)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        full({}, -1, ids=none)()
        torch.cuda.synchronize()
        ok = bool((out.float() == 0).all() and torch.isinf(lse).all() and (lse < 0).all())
        notes["fixed cost: all ids -1"] = f"empty output {'ok' if ok else 'FAIL'}"
        fns["fixed cost: all ids -1"] = full({}, -1, ids=none)
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
    ap.add_argument("--quick", action="store_true", help="fp8: the default and uncapped, no diagnostics")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--cases", default=None, help="comma-separated case names to time (both dtypes; default all)")
    args = ap.parse_args()
    SEL = args.sel
    print(torch.cuda.get_device_name(), flush=True)
    keep = None if args.cases is None else {c.strip() for c in args.cases.split(",")}
    fp8_cases = {k: v for k, v in FP8_CASES.items()
                 if (not args.quick or k in QUICK_FP8) and (keep is None or k in keep)}
    bf16_cases = {k: v for k, v in BF16_CASES.items() if keep is None or k in keep}
    jobs = [(torch.float8_e4m3fn, fp8_cases)] + ([] if args.no_bf16 else [(torch.bfloat16, bf16_cases)])
    for dtype, cases in jobs:
        rate = copy_gbps()
        torch.cuda.empty_cache()
        print(f"copy (measure_ceilings' 1 GiB copy_, alone): {rate:.0f} GB/s", flush=True)
        run_dtype(dtype, cases, rate, diagnostics=not args.quick)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
