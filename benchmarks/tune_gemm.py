"""Regenerates the ``backend="auto"`` table of gemm_fp8_nt_groupwise (mate/ops/gemm/tuning.py).

Run on the H200 from the repository root::

    python benchmarks/tune_gemm.py [--write] [--budget-s 600] [--json OUT.json]

For each M bucket (its upper bound as the representative M) and each DeepSeek-V3 (N, K)
it times cuBLAS blockwise (through mate's cublas backend) and every Triton config of the
sweep (CUDA-graph replay, rotated inputs). A bucket's entry is the Triton config with the
best geometric-mean time over the (N, K) shapes, and its backend is the faster path on
most shapes; a (bucket, N, K) whose fastest candidate (a Triton config or cuBLAS) beats the
entry by more than 3% becomes an override. A config's num_stages is a cap:
``tuning.groupwise_config`` lowers it for short K loops, and a config without SPLIT_K gets
the one-wave split rule. ``--write`` rewrites the block between ``BEGIN TABLE`` and ``END TABLE``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.pop("TRITON_INTERPRET", None)

NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
BUCKET_M = {"m16": 16, "m32": 32, "m64": 64, "m128": 128, "m256": 256, "m512": 512, "m1024": 1024,
            "m2048": 2048, "m4096": 4096, "mmax": 16384}


def configs_for(m: int) -> list[dict]:
    """The sweep: small M (weight-read bound) varies tiles, stages, split-K and the reduce;
    larger M varies tiles and stages (no split-K: the tiles fill the GPU)."""
    out = []
    if m <= 128:
        bms = (64,) if m <= 64 else (64, 128)
        for bm, bn, stages in itertools.product(bms, (64, 128), (4, 6)):
            warps = 8 if bm == 128 else 4
            if bm == 128 and stages > 4:
                continue
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages})
        for split in (2, 4, 8):
            out.append({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "SPLIT_K": split})
        # 3 stages: 72 KB of shared memory, so 3 CTAs per SM overlap one tile's epilogue
        # with the next tiles' loads (the best (128, 24576, 1536) config)
        out.append({"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3})
        out.append({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3})
        out.append({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 5, "REDUCE": "launch"})
        # lagged scaling (a step's wgmma overlaps the scaling of the previous product) and
        # 256-column tiles (half the activation re-reads of 128-column tiles)
        out.append({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 6, "MMA_LAG": True})
        out.append({"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 6, "MMA_LAG": True})
        out.append({"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 8, "num_stages": 4, "MMA_LAG": True})
        if m > 64:
            out.append({"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 5, "MMA_LAG": True})
        if m <= 32:
            # A by masked pointer loads: a 64-row TMA box of A is mostly out of bounds at M <= 32
            out += [{**c, "A_PTR": True} for c in out if c["BLOCK_M"] == 64 and not c.get("MMA_LAG")]
        return out
    for bm, bn, stages in itertools.product((64, 128), (64, 128), (3, 4)):
        warps = 8 if bm == 128 else 4
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages})
    return out


def _time_one(m, n, k, backend, cfg, sets):
    import torch

    from mate import gemm
    from mate._core import recipe
    from mate.ops.gemm import tuning
    from mate.testing.bench import time_fn

    saved = dict(tuning.GROUPWISE_TABLE)
    key = tuning.m_bucket(m)
    try:
        if cfg is not None:
            tuning.GROUPWISE_TABLE[key] = {"backend": "triton", **cfg}
            tuning.GROUPWISE_OVERRIDES.pop(f"{key},{n},{k}", None)
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in sets]
        fns = [lambda x=x, o=o: gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="MN", out=o, backend=backend)
               for x, o in zip(sets, outs)]
        with recipe.disabled():  # the table was edited in place, which launch recipes do not see
            return time_fn(fns, iters=30)
    except Exception as exc:  # a config that fails to compile or launch is skipped
        print(f"  {backend} {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        return math.inf
    finally:
        tuning.GROUPWISE_TABLE.clear()
        tuning.GROUPWISE_TABLE.update(saved)


_PARTIAL = ""


def sweep(budget_s: float, buckets: list[str] | None = None, nks: list[tuple[int, int]] | None = None) -> dict:
    import torch

    from mate.testing.bench import progress, rotation_count

    t0 = time.time()
    results: dict = {}
    for key, m in progress(list(BUCKET_M.items()), "M buckets"):
        if buckets and key not in buckets:
            continue
        for n, k in (nks or NK):
            if time.time() - t0 > budget_s:
                print("budget spent; stopping", flush=True)
                return results
            per_set = m * k + n * k + 2 * m * n
            sets = []
            for _ in range(rotation_count(per_set, max_sets=8)):
                a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
                sa = torch.rand(k // 128, m, device="cuda") * 0.01 + 0.001
                sb = torch.rand(k // 128, -(-n // 128), device="cuda") * 0.01 + 0.001
                sets.append((a, b, sa, sb))
            cub = _time_one(m, n, k, "cublas", None, sets)
            tri = {json.dumps(c, sort_keys=True): _time_one(m, n, k, "triton", c, sets) for c in configs_for(m)}
            results[f"{key},{n},{k}"] = {"cublas": cub, "triton": tri}
            if _PARTIAL:  # written after every shape, so a run cut short keeps what it measured
                Path(_PARTIAL).write_text(json.dumps(results, indent=1))
            best = min(tri.values())
            print(f"{key} N={n} K={k}: cublas {cub:.1f} us, best triton {best:.1f} us", flush=True)
            del sets
            torch.cuda.empty_cache()
    return results


GROUPED_CONFIGS = (
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4, "GROUP_M": 8},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "GROUP_M": 8},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4, "GROUP_M": 16},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4, "GROUP_M": 8},
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 5, "GROUP_M": 8},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 5, "GROUP_M": 8},  # 165 KB smem
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4, "GROUP_M": 8, "MMA_LAG": True},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 5, "GROUP_M": 8, "MMA_LAG": True},
)


def sweep_grouped(G: int = 4, rows: int = 8192, n: int = 4096, k: int = 7168) -> dict:
    """Times the contiguous grouped GEMM at the bar shape for each of GROUPED_CONFIGS."""
    import torch

    from mate import gemm
    from mate.ops.gemm import tuning
    from mate.testing.bench import time_fn
    from mate.testing.inputs import moe_contiguous_operands

    m = G * rows
    a, sa, b, sb, idx = moe_contiguous_operands(G, rows, n, k)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    real = tuning.grouped_config
    res = {}
    try:
        for cfg in GROUPED_CONFIGS:
            tuning.grouped_config = lambda *_, c=cfg: dict(c)
            try:
                t = time_fn(lambda: gemm.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, idx, out=out), iters=10)
            except Exception as exc:
                print(f"  grouped {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                t = math.inf
            res[json.dumps(cfg, sort_keys=True)] = t
            print(f"grouped G={G}x{rows} N={n} K={k} {cfg}: {t:.1f} us, {2.0 * m * n * k / t / 1e6:.0f} TFLOP/s",
                  flush=True)
    finally:
        tuning.grouped_config = real
    return res


def build_table(results: dict) -> tuple[dict, dict]:
    """A bucket's entry: the Triton config with the best geometric-mean time over its shapes,
    on the backend that wins most of them. A (bucket, N, K) whose fastest candidate (any
    Triton config or cuBLAS) beats the entry by more than 3% becomes an override."""
    table, overrides = {}, {}
    for key in BUCKET_M:
        shapes = {k: v for k, v in results.items() if k.split(",")[0] == key}
        if not shapes:
            continue
        cfgs = set().union(*(v["triton"].keys() for v in shapes.values()))

        def geo(c, shapes=shapes):
            ts = [v["triton"].get(c, math.inf) for v in shapes.values()]
            return math.exp(sum(math.log(t) for t in ts) / len(ts)) if all(math.isfinite(t) for t in ts) else math.inf

        best_cfg = min(cfgs, key=geo)
        wins = sum(v["triton"][best_cfg] < v["cublas"] for v in shapes.values())
        backend = "triton" if wins * 2 > len(shapes) else "cublas"
        table[key] = {"backend": backend, **json.loads(best_cfg)}
        for sk, v in shapes.items():
            t_this = v["triton"][best_cfg] if backend == "triton" else v["cublas"]
            fastest = min(v["triton"], key=v["triton"].get)
            if v["cublas"] < v["triton"][fastest]:
                t_best, best = v["cublas"], {"backend": "cublas", **json.loads(best_cfg)}
            else:
                t_best, best = v["triton"][fastest], {"backend": "triton", **json.loads(fastest)}
            if t_best < 0.97 * t_this:
                overrides[sk] = best
    return table, overrides


def write_table(table: dict, overrides: dict) -> None:
    path = ROOT / "mate" / "ops" / "gemm" / "tuning.py"
    text = path.read_text()
    start = text.index("# BEGIN TABLE")
    end = text.index("# END TABLE")
    lines = ["# BEGIN TABLE (generated by benchmarks/tune_gemm.py; edit by re-running it)",
             "GROUPWISE_TABLE: dict[str, dict] = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in table.items()]
    lines += ["}", "# (bucket, n, k) overrides", "GROUPWISE_OVERRIDES: dict[str, dict] = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in overrides.items()]
    lines += ["}", ""]
    path.write_text(text[:start] + "\n".join(lines).replace("'", '"') + text[end:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--budget-s", type=float, default=900.0)
    ap.add_argument("--buckets", default="", help="comma-separated bucket keys (m16,m64,...); default all")
    ap.add_argument("--nk", default="", help="comma-separated NxK shapes (2112x7168,...); default all")
    ap.add_argument("--grouped", action="store_true", help="also time the contiguous grouped configs")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "tune_gemm.json"))
    args = ap.parse_args()
    buckets = [b for b in args.buckets.split(",") if b] or None
    nks = [tuple(int(v) for v in s.split("x")) for s in args.nk.split(",") if s] or None
    global _PARTIAL
    _PARTIAL = args.json
    if args.grouped:
        Path(args.json).with_suffix(".grouped.json").write_text(json.dumps(sweep_grouped(), indent=1))
    results = sweep(args.budget_s, buckets, nks)
    Path(args.json).write_text(json.dumps(results, indent=1))
    table, overrides = build_table(results)
    print(json.dumps({"table": table, "overrides": overrides}, indent=1))
    if args.write:
        from mate.ops.gemm import tuning

        merged = {**tuning.GROUPWISE_TABLE, **table}
        # overrides of buckets this run did not measure are kept
        kept = {k: v for k, v in tuning.GROUPWISE_OVERRIDES.items() if k.split(",")[0] not in table}
        write_table(merged, {**kept, **overrides})
    return 0


if __name__ == "__main__":
    sys.exit(main())
