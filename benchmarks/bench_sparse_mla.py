"""Benchmark of ``sparse_mla_fp8_decode`` (sparse-MLA part 2) on the H200.

Shapes (the spec's DeepSeek-V3.2 decode): H in {16, 32, 64, 128}, B in {1, 8, 32, 64, 128},
q_len in {1, 2}, top-k 2048, page size 64; ``quick`` keeps a subset with the bar shapes.
Indices are uniform over a cache of max(B, 8) * 8192 tokens (no two queries share rows).

Peers on the same attention problem:
- naive PyTorch (gather + einsum in fp32; skipped when the gathered fp32 tensor is huge);
- FlashMLA's sparse FP8 decode (``flash_mla_with_kvcache(..., is_fp8_kvcache=True,
  indices=...)``) when ``flash_mla`` imports, in its own cache format (656 bytes per token:
  512 e4m3 + 4 fp32 scales (1.0 here) + 64 bf16 rope values, the same numbers as ours), with
  a bf16 query and heads padded to 64 when H < 64 (its SM90 kernel supports 64 or 128).

Reported: time (CUDA-graph replay, rotated input sets), TFLOP/s with FlashMLA's count
2 * B * q_len * H * top-k * (576 + 512), and GB/s of B * q_len * top-k * 576 gathered bytes
+ query + output, as a fraction of the measured copy bandwidth. ``mate block_h=64`` rows
time the padded H >= 64 kernel at small H, to compare with the default small-H kernel.
Variant rows time plans beside the default: the Gluon kernel with a 2-stage gather ring,
the Gluon kernel on a split plan, the transposed small-H kernel, the plain kernels with
prefetched indices; the Gluon rows run after its self-check against the
reference passed in a child process (a failure leaves them empty with the reason as note).

``MATE_SPARSE_MLA_BARS=1`` times only the issue's bar shapes (B=64 q1 H=128, B=128 q2
H=128, B=128 q1 H=16, B=8 q1 H=128) with candidate plans (``BAR_CANDIDATES``: stage
counts, splits, padded heads, fp32 split scratch) beside the default and FlashMLA, so one
short GPU run picks the best configuration.
"""

from __future__ import annotations

import math
import os

import torch

from mate.ops.sparse_mla.metadata import plan_decode
from mate.sparse_mla_interface import sparse_mla_fp8_decode
from mate.testing import rel_error
from mate.testing.bench import record, rotation_count, time_fn, time_interleaved

FAMILY = "sparse_mla"
OP = "sparse_mla_fp8_decode"
TOP_K = 2048
PAGE = 64
FULL = [(h, b, s) for h in (16, 32, 64, 128) for b in (1, 8, 32, 64, 128) for s in (1, 2)]
# Plan variants timed beside the default in the quick and full runs (H, B, q_len) -> overrides.
PIPE3 = dict(gluon=True, num_stages=3)  # the 64-head Gluon kernel with a 3-stage gather ring (default 2)
PLAIN = dict(gluon=False, prefetch_idx=True)  # the plain kernel with prefetched indices
VARIANTS = {(16, 128, 1): [dict(transposed=True, block_h=16), dict(chains=1)],
            (128, 64, 1): [PIPE3, PLAIN],
            (128, 8, 1): [PLAIN, dict(num_splits=4), dict(pdl=True)], (128, 128, 2): [PIPE3],
            (64, 128, 1): [PIPE3], (32, 128, 1): [dict(transposed=True, block_h=32)],
            (128, 1, 1): [dict(pdl=False)], (16, 1, 1): [dict(pdl=False)]}
# Bar shapes (H, B, q_len) -> plan_decode overrides timed beside the default plan.
BAR_CANDIDATES = {  # in order of interest, in case a run is cut short
    (16, 128, 1): [dict(chains=1), dict(transposed=True, block_h=16), dict(block_h=64)],
    (128, 8, 1): [PLAIN, dict(partial_dtype=torch.float32), dict(num_splits=4)],
    (128, 64, 1): [PIPE3, PLAIN],
    (128, 128, 2): [PIPE3],
}
QUICK = [(128, 64, 1), (128, 128, 2), (16, 128, 1), (128, 8, 1), (64, 128, 1), (32, 128, 1), (16, 32, 2),
         (128, 1, 1), (16, 1, 1)]


def _variant_name(kw: dict) -> str:
    """``gluon=True`` reads "gluon"; other overrides as name=value."""
    return " ".join("gluon" if (k, v) == ("gluon", True) else f"{k}={str(v).removeprefix('torch.')}"
                    for k, v in kw.items())


def _gluon_status(shapes: list, variants: dict) -> str | None:
    """None when the Gluon kernel passed its self-check in a child process (or is not
    benchmarked); else why its rows are left empty. The child process keeps a faulting
    kernel from poisoning this process's CUDA context (and the later benchmarks)."""
    if not any(kw.get("gluon") for shape in shapes for kw in variants.get(shape, [])):
        return None
    try:
        from mate.ops.sparse_mla.decode_gluon import probe_in_subprocess

        return probe_in_subprocess()
    except Exception as exc:
        return f"Gluon kernel unavailable: {type(exc).__name__}: {exc}"[:300]


def _flops(B: int, q_len: int, H: int) -> float:
    return 2.0 * B * q_len * H * TOP_K * (576 + 512)


def _bytes(B: int, q_len: int, H: int) -> float:
    return B * q_len * (TOP_K * 576 + H * 576 + H * 512 * 2)


def _cache(B: int) -> torch.Tensor:
    pages = max(B, 8) * 8192 // PAGE
    return (torch.randn(pages, PAGE, 576, device="cuda") * 0.5).to(torch.float8_e4m3fn)


def _sets(B: int, q_len: int, H: int, tokens: int) -> list[dict]:
    n = rotation_count(B * q_len * TOP_K * 576)
    sets = []
    for _ in range(n):
        sets.append({
            "q": torch.randn(B, q_len, H, 576, device="cuda").to(torch.float8_e4m3fn),
            "idx": torch.randint(0, tokens, (B, q_len, TOP_K), device="cuda", dtype=torch.int32),
            "sl": torch.full((B,), TOP_K, device="cuda", dtype=torch.int32),
            "out": torch.empty(B, q_len, H, 512, device="cuda", dtype=torch.bfloat16),
        })
    return sets


def _mate_fn(s: dict, kv: torch.Tensor, scale: float, md):
    return lambda: sparse_mla_fp8_decode(s["q"], kv, None, 128, 512, 64, s["idx"], s["sl"], 0, TOP_K,
                                         out=s["out"], bmm1_scale=scale, metadata=md)


def _naive(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    rows = kv.view(-1, 576)[idx.long()].float()  # [B, q_len, topk, 576]
    logits = torch.einsum("bthd,btkd->bthk", q.float(), rows) * scale
    p = torch.softmax(logits, dim=-1)
    return torch.einsum("bthk,btkd->bthd", p, rows[..., :512]).to(torch.bfloat16)


def _flashmla_cache(kv: torch.Tensor) -> torch.Tensor:
    """Our e4m3 rows in FlashMLA's 656-byte V3.2 layout (scales 1.0, rope as bf16)."""
    pages = kv.shape[0]
    fm = torch.empty(pages, PAGE, 656, dtype=torch.uint8, device="cuda")
    fm[..., :512] = kv[..., :512].view(torch.uint8)
    fm[..., 512:528].view(torch.float32)[:] = 1.0
    fm[..., 528:].view(torch.bfloat16)[:] = kv[..., 512:].to(torch.bfloat16)
    return fm.view(pages, PAGE, 1, 656).view(torch.float8_e4m3fn)


def run(ceilings: dict, quick: bool = False) -> list[dict]:
    rows: list[dict] = []
    try:
        import flash_mla  # noqa: F401

        fm_err = None
    except Exception as exc:  # the peer is optional
        fm_err = f"flash_mla not importable: {type(exc).__name__}: {exc}"[:200]
    caches: dict[int, torch.Tensor] = {}
    fm_caches: dict[int, torch.Tensor] = {}
    scale = 1 / math.sqrt(576)
    bars = os.environ.get("MATE_SPARSE_MLA_BARS", "") not in ("", "0")
    shapes = list(BAR_CANDIDATES) if bars else QUICK if quick else FULL
    variants = BAR_CANDIDATES if bars else VARIANTS
    gluon_err = _gluon_status(shapes, variants)
    if gluon_err is not None:
        print(f"[bench_sparse_mla] {gluon_err}", flush=True)
    for H, B, q_len in shapes:
        shape = f"B={B} q_len={q_len} H={H} topk={TOP_K}"
        n_before = len(rows)
        key = max(B, 8)
        if key not in caches:
            caches.clear()
            fm_caches.clear()
            torch.cuda.empty_cache()
            caches[key] = _cache(B)
        kv = caches[key]
        tokens = kv.shape[0] * PAGE
        sets = _sets(B, q_len, H, tokens)
        common = dict(family=FAMILY, op=OP, shape=shape, flops=_flops(B, q_len, H), nbytes=_bytes(B, q_len, H),
                      dtype="e4m3", ceiling="copy_GBps")
        md0 = plan_decode(B, q_len, H, TOP_K, "cuda")  # sequential calls may share one plan
        note = (f"block_h={md0.block_h} block_n={md0.block_n} splits={md0.num_splits} warps={md0.num_warps} "
                f"stages={md0.num_stages} maxnreg={md0.max_regs}" + (" pdl=True" if md0.pdl else ""))
        # correctness on the first set against the naive reference (not timed)
        s0 = sets[0]
        _mate_fn(s0, kv, scale, md0)()
        ref = None
        if B * q_len <= (256 if bars else 64):
            ref = _naive(s0["q"], kv, s0["idx"], scale)
            err = rel_error(s0["out"], ref)
            note += f"; rel err vs naive {err:.1e}" + (" (FAILED)" if err > 2e-2 else "")
        # mate, its variants and FlashMLA are timed interleaved (time_interleaved): the bar
        # is a ratio to FlashMLA, so both see the same clocks and L2 state
        cases: dict[str, list] = {"mate": [_mate_fn(s, kv, scale, md0) for s in sets]}
        notes: dict[str, str] = {"mate": note}
        base = s0["out"].clone()  # variants without a naive reference are compared with the default
        for kw in variants.get((H, B, q_len), []):
            name = f"mate {_variant_name(kw)}"
            if kw.get("gluon") and gluon_err is not None:
                cases[name], notes[name] = [], gluon_err[:300]
                continue
            try:
                mdc = plan_decode(B, q_len, H, TOP_K, "cuda", **kw)
                _mate_fn(s0, kv, scale, mdc)()
                nc = (f"block_h={mdc.block_h} block_n={mdc.block_n} splits={mdc.num_splits} "
                      f"warps={mdc.num_warps} stages={mdc.num_stages} maxnreg={mdc.max_regs} "
                      f"prefetch_idx={mdc.prefetch_idx} gluon={mdc.gluon} pdl={mdc.pdl}")
                if ref is not None:
                    err = rel_error(s0["out"], ref)
                    nc += f"; rel err vs naive {err:.1e}" + (" (FAILED)" if err > 2e-2 else "")
                else:
                    diff = rel_error(s0["out"], base)
                    nc += f"; rel diff vs default {diff:.1e}" + (" (FAILED)" if diff > 2e-2 else "")
                cases[name], notes[name] = [_mate_fn(s, kv, scale, mdc) for s in sets], nc
            except Exception as exc:
                cases[name], notes[name] = [], f"{type(exc).__name__}: {exc}"[:200]
        if H < 64 and not bars:  # the padded H >= 64 kernel, for comparison with the small-H kernel
            md64 = plan_decode(B, q_len, H, TOP_K, "cuda", block_h=64)
            cases["mate block_h=64"] = [_mate_fn(s, kv, scale, md64) for s in sets]
            notes["mate block_h=64"] = f"block_h=64 splits={md64.num_splits}"
        if fm_err is not None:
            cases["FlashMLA"], notes["FlashMLA"] = [], fm_err
        else:
            cases["FlashMLA"], notes["FlashMLA"] = _flashmla_case(sets, kv, fm_caches, key, H, scale)
        timed = time_interleaved({k: v for k, v in cases.items() if v})
        recs = {}
        for name in cases:
            t = timed.get(name)
            if isinstance(t, Exception):
                t, notes[name] = None, f"{type(t).__name__}: {t}"[:200]
            recs[name] = record(ceilings, impl=name, time_us=t, note=notes[name], **common)
        rows += [r for name, r in recs.items() if name != "FlashMLA"]
        if not bars:  # the naive peer is timed in the full runs only
            if ref is not None:
                try:
                    t = time_fn([lambda s=s, kv=kv: _naive(s["q"], kv, s["idx"], scale) for s in sets[:4]])
                    nn = ""
                except Exception as exc:
                    t, nn = None, f"{type(exc).__name__}: {exc}"[:200]
                rows.append(record(ceilings, impl="naive torch", time_us=t, note=nn, **common))
            else:
                rows.append(record(ceilings, impl="naive torch", time_us=None,
                                   note="skipped: gathered fp32 too large", **common))
        rows.append(recs["FlashMLA"])  # last in each shape's rows, as before
        del sets
        for r in rows[n_before:]:  # progress, in case the run is cut short
            print(f"[bench_sparse_mla] {r['shape']} {r['impl']}: {r.get('time_us')} us "
                  f"{r.get('TFLOPs') or 0:.0f} TF {r.get('GBps') or 0:.0f} GB/s {r.get('note', '')}", flush=True)
    return rows


def probe_line(label: str, cases: dict, sets, kv, B: int, H: int, scale: float) -> str:
    """The probes' one-line result: ``cases`` and FlashMLA (when it loads) timed interleaved,
    with FlashMLA's difference from mate's output (which ``sets[0]["out"]`` must hold)."""
    try:
        fm, note = _flashmla_case(sets, kv, {}, max(B, 8), H, scale)
    except Exception as exc:  # flash_mla not importable
        fm, note = [], f"FlashMLA: {type(exc).__name__}: {exc}"[:200]
    if fm:
        cases = {**cases, "FlashMLA": fm}
    times = time_interleaved(cases, rounds=10, iters=100)
    return f"{label}: " + "  ".join(
        f"{name} {t:.1f}" if isinstance(t, float) else f"{name} {t}" for name, t in times.items()) + f" ({note})"


def _flashmla_case(sets, kv, fm_caches, key, H, scale) -> tuple[list, str]:
    """FlashMLA's calls for the timing sets (in its own cache format, heads padded to 64)
    and a note with its difference from mate's output; no calls and the error on failure."""
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata

    try:
        if key not in fm_caches:
            fm_caches[key] = _flashmla_cache(kv)
        fkv = fm_caches[key]
        hp = max(64, H)
        fsets = []
        for s in sets:
            B, q_len = s["q"].shape[:2]
            q = torch.zeros(B, q_len, hp, 576, device="cuda", dtype=torch.bfloat16)
            q[:, :, :H] = s["q"].to(torch.bfloat16)
            fsets.append((q, s["idx"], get_mla_metadata()[0]))

        def call(q, idx, meta):
            return flash_mla_with_kvcache(q, fkv, None, None, 512, meta, None, softmax_scale=scale,
                                          is_fp8_kvcache=True, indices=idx)

        o, _ = call(*fsets[0])
        note = f"heads padded to {hp}" if hp != H else ""
        err = rel_error(o[:, :, :H], sets[0]["out"])
        note += f"; rel diff vs mate {err:.1e}"
        return [lambda f=f: call(*f) for f in fsets], note.strip("; ")
    except Exception as exc:
        return [], f"{type(exc).__name__}: {exc}"[:200]
