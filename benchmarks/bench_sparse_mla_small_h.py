"""Small-H sparse MLA decode on the H200: the default plan against the 8-warp small-H kernel.

    python benchmarks/bench_sparse_mla_small_h.py [--budget SECONDS] [--no-probe] [--variants]

Shapes (top-k 2048, page 64): B=128 q1 H=16, B=64 q1 H=16, B=64 q2 H=16, B=32 q2 H=16,
B=1 q1 H=16, B=128 q1 H=32. Candidates per shape: ``default`` (the public op with the default
plan: H <= 16 the one-warpgroup kernel, ``decode_gluon_small_h2.py``, as its dual kernel where
the plan pairs chains), ``1 chain/program`` (H <= 16: the plan with ``chains=1``, the default
before the dual kernel), ``8warp`` (the public op on the plan of the 8-warp small-H kernel,
``decode_gluon_small_h.py``; at H=32 it is the default). Each row: median time (CUDA-graph
replays, all candidates of a shape interleaved), GB/s of the gathered rows (B * q_len * top-k * 576 bytes),
that rate as a fraction of the measured copy bandwidth (read + write of 1 GiB), the max abs
error of out / lse against ``sparse_mla_decode_reference`` (bf16 out is ~1, lse ~10), ``ok``
when every element is within the GPU tolerances of the tests, and ``adv``: the same check on a
problem of the same shape with 10% -1 and 5% out-of-range entries and random seq_lens (one 0,
one 1, the others in [1, top-k]). Writes nothing.

``--variants``: the one-warpgroup kernel's candidates (launcher arguments of
``sparse_mla_decode_gluon_small_h_wg`` on the plan's chains; ``VARIANTS``: the fp16 P·V
that FP8 P·V replaced as the default) on the default plan at B=128 q1 H=16, B=32 q2 H=16 (B=64 q2 H=16 last, if the
budget allows), interleaved with the default, ``default again`` (the default plan's launch a
second time: its distance to ``default`` is the run's noise floor, up to 2.8 us at B=128 q1 in
session 19) and ``combine only`` (the plan's combine launch alone, the split's cost). Extra
column ``=def``: out and lse bit-identical to the default's. B=128 q1 H=32 (8-warp kernel,
untouched) is timed as a guard.
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

SHAPES = ((128, 1, 16), (64, 1, 16), (64, 2, 16), (32, 2, 16), (1, 1, 16), (128, 1, 32))  # (B, q_len, H)


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


def _adversarial(B: int, q_len: int, H: int, tokens: int):
    """A problem with -1 / out-of-range entries and short or empty rows (GPU tensors)."""
    g = torch.Generator(device="cuda").manual_seed(B * 100 + q_len * 10 + H)
    idx = torch.randint(0, tokens, (B, q_len, TOP_K), device="cuda", dtype=torch.int32, generator=g)
    r = torch.rand(idx.shape, device="cuda", generator=g)
    idx = torch.where(r < 0.1, -1, torch.where(r < 0.15, tokens + 7, idx))
    sl = torch.randint(1, TOP_K + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    sl[-1] = 0
    sl[0] = 1
    return dict(q=torch.randn(B, q_len, H, 576, device="cuda", generator=g).to(torch.float8_e4m3fn), idx=idx, sl=sl,
                out=torch.empty(B, q_len, H, 512, device="cuda", dtype=torch.bfloat16),
                lse=torch.empty(B, q_len, H, device="cuda"))


def _check(fn, s, ref_o, ref_l):
    """(max |out err|, max |lse err|, all within the GPU tolerances) of one call on set ``s``."""
    s["out"].fill_(float("nan"))
    s["lse"].fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    return ((s["out"].float() - ref_o.float()).abs().nan_to_num(float("inf")).max().item(),
            (s["lse"] - ref_l).abs().nan_to_num(float("inf")).max().item(),
            _within(s["out"], ref_o, 3e-3, 3e-2) and _within(s["lse"], ref_l, 1.5e-2, 2e-3))


def _within(x: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    x, ref = x.float(), ref.float()
    # equal infinities (lse of an empty row is +inf) match; inf - inf would be NaN
    return bool(((x == ref) | ((x - ref).abs() <= atol + rtol * ref.abs())).all())


VARIANTS: dict[str, dict] = {"pv fp16": dict(pv_fp8=False)}  # label -> launcher arguments


def _var_fn(s, kv, md, **kw):
    """The one-warpgroup launcher with candidate arguments ``kw`` on the plan ``md``."""
    from mate.ops.sparse_mla.decode_gluon_small_h2 import sparse_mla_decode_gluon_small_h_wg

    kv_rows = kv.view(-1, 576)
    return lambda: sparse_mla_decode_gluon_small_h_wg(s["q"], kv_rows, s["idx"], s["sl"], s["out"], s["lse"],
                                                      md.partial_o, md.partial_lse, SCALE, 1.0, md.block_h,
                                                      md.num_splits, md.split_blocks, md.num_stages,
                                                      **{"chains": md.chains, **kw})


def _combine_fn(s, md):
    from mate.ops.sparse_mla.decode import launch_combine

    B, q_len, H = s["q"].shape[:3]
    return lambda: launch_combine(md.partial_o, md.partial_lse, s["out"], s["lse"], 1.0, H, md.num_splits, B * q_len)


def _within_budget(shapes, budget: float, t0: float):
    """The (B, q_len, H) shapes, each skipped (and said so) once ``budget`` seconds have passed."""
    for B, q_len, H in shapes:
        if time.time() - t0 > budget:
            print(f"B={B} q{q_len} H={H}: skipped (budget)", flush=True)
            continue
        yield B, q_len, H


def _problem(B: int, q_len: int, H: int):
    """The timed input sets of one shape, the reference of the first, and an adversarial
    problem (invalid indices, seq_lens 0 and 1) with its reference."""
    kv, sets = _inputs(B, q_len, H)
    s0 = sets[0]
    ref = sparse_mla_decode_reference(s0["q"], kv, s0["idx"], s0["sl"], SCALE, 1.0)
    adv = _adversarial(B, q_len, H, kv.shape[0] * PAGE)
    ref_adv = sparse_mla_decode_reference(adv["q"], kv, adv["idx"], adv["sl"], SCALE, 1.0)
    return kv, sets, ref, adv, ref_adv


def variants(ceiling: float, budget: float, t0: float) -> None:
    """The ``--variants`` table."""
    print(f"{'shape':<16} {'candidate':<14} {'us':>6} {'GB/s':>5} {'%copy':>6} {'out err':>8} {'lse err':>8} ok  adv "
          "=def plan")
    for B, q_len, H in _within_budget(((128, 1, 16), (32, 2, 16), (128, 1, 32), (64, 2, 16)), budget, t0):
        shape = f"B={B} q{q_len} H={H}"
        kv, sets, ref, adv, ref_adv = _problem(B, q_len, H)
        s0 = sets[0]
        md = plan_decode(B, q_len, H, TOP_K, "cuda")
        makes = {"default": lambda s, kv=kv, md=md: _api_fn(s, kv, md)}  # label -> fn factory for an input set
        if md.gluon and md.num_warps == 4:
            for label, kw in VARIANTS.items():
                makes[label] = lambda s, kv=kv, md=md, kw=kw: _var_fn(s, kv, md, **kw)
            makes["default again"] = lambda s, kv=kv, md=md: _var_fn(s, kv, md)
        cands = {label: ([make(s) for s in sets], make) for label, make in makes.items()}
        errs, outs = {}, {}
        for label, (fns, make) in cands.items():
            try:
                errs[label] = _check(fns[0], s0, *ref) + (_check(make(adv), adv, *ref_adv)[2],)
                outs[label] = (s0["out"].clone(), s0["lse"].clone(), adv["out"].clone(), adv["lse"].clone())
            except Exception as exc:  # reported in the table
                errs[label] = exc
        timed = {k: v[0] for k, v in cands.items() if not isinstance(errs[k], Exception)}
        if md.num_splits > 1:
            timed["combine only"] = [_combine_fn(s, md) for s in sets]
        times = time_interleaved(timed)
        nbytes = B * q_len * TOP_K * 576
        plan = f"splits={md.num_splits} warps={md.num_warps}"
        for label in list(cands) + (["combine only"] if md.num_splits > 1 else []):
            e = errs.get(label)
            t = times.get(label, e)
            if isinstance(t, Exception):
                print(f"{shape:<16} {label:<14} {'-':>6} {'-':>5} {'-':>6} {'-':>8} {'-':>8} -   -   -    "
                      f"{type(t).__name__}: {str(t)[:150]}", flush=True)
                continue
            if e is None:  # the combine alone: time only
                print(f"{shape:<16} {label:<14} {t:6.1f} {'':>5} {'':>6} {'':>8} {'':>8} {'':3} {'':3} {'':4} {plan}",
                      flush=True)
                continue
            same = all(torch.equal(a, b) for a, b in zip(outs[label], outs["default"])) if "default" in outs else False
            gbps = nbytes / (t * 1e-6) / 1e9
            print(f"{shape:<16} {label:<14} {t:6.1f} {gbps:5.0f} {100 * gbps / ceiling:5.1f}% {e[0]:8.1e} {e[1]:8.1e} "
                  f"{'ok ' if e[2] else 'BAD'} {'ok ' if e[3] else 'BAD'} {'yes ' if same else 'no  '} {plan}",
                  flush=True)
        del sets, kv, cands, makes, adv, outs
        torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=100.0, help="seconds; later shapes are skipped past it")
    ap.add_argument("--no-probe", action="store_true", help="skip the self-check in a child process")
    ap.add_argument("--variants", action="store_true", help="the one-warpgroup candidates' table (see the docstring)")
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
    if args.variants:
        variants(ceiling, args.budget, t0)
        return 0
    print(f"{'shape':<18} {'candidate':<20} {'us':>7} {'GB/s':>6} {'%copy':>6} {'out err':>8} {'lse err':>8} ok  adv "
          "plan")
    for B, q_len, H in _within_budget(SHAPES, args.budget, t0):
        shape = f"B={B} q{q_len} H={H}"
        kv, sets, ref, adv, ref_adv = _problem(B, q_len, H)
        s0 = sets[0]
        md = plan_decode(B, q_len, H, TOP_K, "cuda")
        md8 = plan_decode(B, q_len, H, TOP_K, "cuda", gluon=True, transposed=True, num_warps=8)
        cands = {"default": md, "8warp": md8}  # label -> plan
        if H <= 16:
            cands["1 chain/program"] = plan_decode(B, q_len, H, TOP_K, "cuda", chains=1)
        fns, errs = {}, {}
        for label, mdc in cands.items():
            fns[label] = [_api_fn(s, kv, mdc) for s in sets]
            try:
                errs[label] = _check(fns[label][0], s0, *ref) + (_check(_api_fn(adv, kv, mdc), adv, *ref_adv)[2],)
            except Exception as exc:  # reported in the table
                errs[label] = exc
        times = time_interleaved({k: v for k, v in fns.items() if not isinstance(errs[k], Exception)})
        nbytes = B * q_len * TOP_K * 576
        for label, mdc in cands.items():
            plan = (f"block_h={mdc.block_h} splits={mdc.num_splits} warps={mdc.num_warps} stages={mdc.num_stages} "
                    f"gluon={mdc.gluon} chains={mdc.chains}")
            e = errs[label]
            t = times.get(label, e)
            if isinstance(t, Exception):
                print(f"{shape:<18} {label:<20} {'-':>7} {'-':>6} {'-':>6} {'-':>8} {'-':>8} -   -   "
                      f"{type(t).__name__}: {str(t)[:150]}", flush=True)
                continue
            gbps = nbytes / (t * 1e-6) / 1e9
            print(f"{shape:<18} {label:<20} {t:7.1f} {gbps:6.0f} {100 * gbps / ceiling:5.1f}% {e[0]:8.1e} "
                  f"{e[1]:8.1e} {'ok ' if e[2] else 'BAD'} {'ok ' if e[3] else 'BAD'} {plan}", flush=True)
        del sets, kv, fns, adv
        torch.cuda.empty_cache()
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
