"""Small-H sparse MLA decode on the H200: the default plan against the 8-warp small-H kernel.

    python benchmarks/bench_sparse_mla_small_h.py [--budget SECONDS] [--no-probe]

Shapes (top-k 2048, page 64): B=128 q1 H=16, B=64 q1 H=16, B=64 q2 H=16, B=32 q2 H=16,
B=128 q1 H=32. Candidates per shape: ``default`` (the public op with the default plan:
H <= 16 the one-warpgroup kernel, ``decode_gluon_small_h2.py``), ``8warp`` (the public op on
the plan of the 8-warp small-H kernel, ``decode_gluon_small_h.py``: the default before the
one-warpgroup kernel; at H=32 both run it). Each row: median time (CUDA-graph replays, all
candidates of a shape interleaved), GB/s of the gathered rows (B * q_len * top-k * 576 bytes),
that rate as a fraction of the measured copy bandwidth (read + write of 1 GiB), the max abs
error of out / lse against ``sparse_mla_decode_reference`` (bf16 out is ~1, lse ~10) and ``ok``
when every element is within the GPU tolerances of the tests. Writes nothing.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from mate.ops.sparse_mla.metadata import plan_decode
from mate.ops.sparse_mla.reference import sparse_mla_decode_reference
from mate.sparse_mla_interface import sparse_mla_fp8_decode
from mate.testing.bench import measure_ceilings, rotation_count, time_interleaved

TOP_K = 2048
PAGE = 64
SCALE = 1 / math.sqrt(576)

SHAPES = ((128, 1, 16), (64, 1, 16), (64, 2, 16), (32, 2, 16), (128, 1, 32))  # (B, q_len, H)


def _inputs(B: int, q_len: int, H: int):
    tokens = max(B, 8) * 8192
    kv = (torch.randn(tokens // PAGE, PAGE, 576, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    sets = []
    for _ in range(rotation_count(B * q_len * TOP_K * 576)):
        sets.append(dict(q=torch.randn(B, q_len, H, 576, device="cuda").to(torch.float8_e4m3fn),
                         idx=torch.randint(0, tokens, (B, q_len, TOP_K), device="cuda", dtype=torch.int32),
                         sl=torch.full((B,), TOP_K, device="cuda", dtype=torch.int32),
                         out=torch.empty(B, q_len, H, 512, device="cuda", dtype=torch.bfloat16),
                         lse=torch.empty(B, q_len, H, device="cuda")))
    return kv, sets


def _api_fn(s, kv, md):
    return lambda: sparse_mla_fp8_decode(s["q"], kv, None, 128, 512, 64, s["idx"], s["sl"], 0, TOP_K, out=s["out"],
                                         lse=s["lse"], bmm1_scale=SCALE, metadata=md)


def _within(x: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    x, ref = x.float(), ref.float()
    return bool(((x - ref).abs() <= atol + rtol * ref.abs()).all())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=100.0, help="seconds; later shapes are skipped past it")
    ap.add_argument("--no-probe", action="store_true", help="skip the self-check in a child process")
    args = ap.parse_args()
    t0 = time.time()
    print(torch.cuda.get_device_name(), flush=True)
    from mate.ops.sparse_mla.decode_gluon_small_h import probe_in_subprocess

    if not args.no_probe:
        reason = probe_in_subprocess(timeout_s=90)
        print(f"small-H Gluon self-check (child process, {time.time() - t0:.0f} s): "
              f"{'passed' if reason is None else reason}", flush=True)
    ceiling = measure_ceilings()["copy_GBps"]
    print(f"copy bandwidth {ceiling:.0f} GB/s (read + write)", flush=True)
    print(f"{'shape':<18} {'candidate':<34} {'us':>7} {'GB/s':>6} {'%copy':>6} {'out err':>8} {'lse err':>8} ok  plan")
    for B, q_len, H in SHAPES:
        if time.time() - t0 > args.budget:
            print(f"B={B} q{q_len} H={H}: skipped (budget)", flush=True)
            continue
        shape = f"B={B} q{q_len} H={H}"
        kv, sets = _inputs(B, q_len, H)
        s0 = sets[0]
        ref_o, ref_l = sparse_mla_decode_reference(s0["q"], kv, s0["idx"], s0["sl"], SCALE, 1.0)
        cands = {}  # label -> (list of fns, plan note)
        md = plan_decode(B, q_len, H, TOP_K, "cuda")
        cands["default"] = ([_api_fn(s, kv, md) for s in sets], md)
        md8 = plan_decode(B, q_len, H, TOP_K, "cuda", gluon=True, transposed=True, num_warps=8)
        cands["8warp (old default)"] = ([_api_fn(s, kv, md8) for s in sets], md8)
        errs = {}
        for label, (fns, _) in cands.items():
            try:
                s0["out"].fill_(float("nan"))
                s0["lse"].fill_(float("nan"))
                fns[0]()
                torch.cuda.synchronize()
                errs[label] = ((s0["out"].float() - ref_o.float()).abs().nan_to_num(float("inf")).max().item(),
                               (s0["lse"] - ref_l).abs().nan_to_num(float("inf")).max().item(),
                               _within(s0["out"], ref_o, 3e-3, 3e-2) and _within(s0["lse"], ref_l, 1.5e-2, 2e-3))
            except Exception as exc:  # reported in the table
                errs[label] = exc
        times = time_interleaved({k: v[0] for k, v in cands.items() if not isinstance(errs[k], Exception)})
        nbytes = B * q_len * TOP_K * 576
        for label, (_, mdc) in cands.items():
            plan = (f"block_h={mdc.block_h} splits={mdc.num_splits} warps={mdc.num_warps} stages={mdc.num_stages} "
                    f"gluon={mdc.gluon}")
            e = errs[label]
            t = times.get(label, e)
            if isinstance(t, Exception):
                print(f"{shape:<18} {label:<34} {'-':>7} {'-':>6} {'-':>6} {'-':>8} {'-':>8} -   "
                      f"{type(t).__name__}: {str(t)[:150]}", flush=True)
                continue
            gbps = nbytes / (t * 1e-6) / 1e9
            print(f"{shape:<18} {label:<34} {t:7.1f} {gbps:6.0f} {100 * gbps / ceiling:5.1f}% {e[0]:8.1e} "
                  f"{e[1]:8.1e} {'ok ' if e[2] else 'BAD'} {plan}", flush=True)
        del sets, kv, cands
        torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
