"""GPU timing and ceilings used by the benchmarks.

Times are medians of CUDA-graph replays (or CUDA events when a callable cannot be
captured), with inputs rotated over several sets so that the L2 does not flatter. Each
timed region starts behind a short GPU spin (``torch.cuda._sleep``), so the host's launch
latency, which an idle GPU would otherwise wait for between the start event and the first
kernel, is not counted; gaps between the kernels of one replay still are.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from mate.testing.graphs import capture_graph

T = TypeVar("T")

__all__ = ["time_fn", "time_interleaved", "measure_ceilings", "rotation_count", "record", "progress", "times_line",
           "bandwidth_lines", "host_us", "back_to_back_us"]

L2_BYTES = 60 * (1 << 20)
SPIN_CYCLES = 100_000  # ~50 us at the H200's clock: longer than a graph launch from the host


def _timed(run: Callable[[], Any]) -> float:
    """GPU time in microseconds of what ``run`` enqueues, started behind a GPU spin so the
    launch latency of the host does not fall inside the timed region."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SPIN_CYCLES)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def rotation_count(bytes_per_set: int, min_total: int = 4 * L2_BYTES, max_sets: int = 64) -> int:
    """How many input sets to rotate through so their total exceeds several L2 sizes."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, -(-min_total // bytes_per_set)))


def time_fn(
    fns: Sequence[Callable[[], Any]] | Callable[[], Any],
    *,
    iters: int = 50,
    warmup: int = 5,
    use_graph: bool = True,
) -> float:
    """Median time in microseconds of one call, rotating over ``fns`` (one per input set).

    With ``use_graph`` the rotation is captured in one CUDA graph and each replay is
    timed with events; the time is divided by the number of calls per replay.
    """
    if callable(fns):
        fns = [fns]
    fns = list(fns)
    for _ in range(warmup):
        for f in fns:
            f()
    torch.cuda.synchronize()
    times: list[float] = []
    if use_graph:
        graph = capture_graph(lambda: [f() for f in fns])
        graph.replay()
        torch.cuda.synchronize()
        reps = max(3, iters // len(fns))
        for _ in range(reps):
            times.append(_timed(graph.replay) / len(fns))
    else:
        for i in range(iters):
            times.append(_timed(fns[i % len(fns)]))
    return statistics.median(times)


def host_us(fn: Callable[[], Any], calls: int = 200, rounds: int = 1, spin_cycles: int = 1_000_000_000) -> float:
    """Host microseconds of one eager call of ``fn``: the median over ``calls`` back-to-back
    calls issued behind a GPU spin of ``spin_cycles`` (so no call waits for the GPU), the
    minimum over ``rounds`` such medians. The host's speed varies between processes on the
    device machine: compare versions by alternating processes, not across calls."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda._sleep(spin_cycles)
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        best = min(best, statistics.median(ts) * 1e6)
    return best


def back_to_back_us(fn: Callable[[], Any], iters: int = 30, repeats: int = 5) -> float:
    """Time per call of ``iters`` eager calls issued back to back (events around all of them,
    no spin), median over ``repeats``: the GPU waits for the host whenever a call's host work
    outlasts its kernels, so this is what an eager caller sees."""
    times = []
    for _ in range(repeats):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(times)


def interleave_order(names: Sequence[T], r: int) -> list[T]:
    """Order of the cases in round ``r`` of ``time_interleaved``: row r of a Williams design
    (a Latin square in which, over its n rows, each case directly follows every other case
    once; for odd n the square and its mirror, 2n rows, twice). A plain rotation keeps each
    case behind the same one, and under power-limited clocks the case behind a low-power
    one ran up to 8% faster than the same cuBLAS call behind a high-power one."""
    n = len(names)
    if n == 0:
        return []
    base = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    row = r % (2 * n if n % 2 else n)
    order = [names[(b + row) % n] for b in base]
    return order[::-1] if row >= n else order


def time_interleaved(
    cases: Mapping[str, Sequence[Callable[[], Any]] | Callable[[], Any]],
    *,
    rounds: int = 5,
    iters: int = 50,
    warmup: int = 5,
) -> dict[str, float | Exception]:
    """Median time in microseconds of one call of each case, the cases' CUDA-graph replays
    interleaved: ``rounds`` rounds, each replaying every case ``iters / rounds`` times (at least twice) in
    the order of ``interleave_order`` (a different start and predecessor per round).

    A case timed alone right after another (or first, from idle clocks) is measured in a
    different clock and L2 state than its peer; interleaving gives each case the same
    conditions, which matters when a bar is a ratio to a peer in the same run. A case
    whose warm-up or capture raises gets the exception instead of a time.
    """
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]] = {}
    result: dict[str, float | Exception] = {}
    for name, fns in cases.items():
        fns = [fns] if callable(fns) else list(fns)
        try:
            for _ in range(warmup):
                for f in fns:
                    f()
            graphs[name] = (capture_graph(lambda fns=fns: [f() for f in fns]), len(fns))
        except Exception as exc:  # reported per case; the other cases are still timed
            result[name] = exc
    torch.cuda.synchronize()
    names = list(graphs)
    times: dict[str, list[float]] = {name: [] for name in names}
    per_round = max(1, iters // max(1, rounds))
    for r in range(rounds):
        for name in interleave_order(names, r):
            graph, calls = graphs[name]
            graph.replay()  # one untimed replay after switching cases
            for _ in range(max(2, per_round // calls)):
                times[name].append(_timed(graph.replay) / calls)
    for name in names:
        result[name] = statistics.median(times[name])
    return {name: result[name] for name in cases}


def times_line(times: Mapping[str, float | Exception], flops: float) -> str:
    """One line of ``time_interleaved``'s results for a probe: each case's time (us) and
    TFLOP/s, or its error."""
    return "  ".join(f"{name} {t:.1f} us {flops / t / 1e6:.0f} TF" if isinstance(t, float) else f"{name} {t}"
                     for name, t in times.items())


def bandwidth_lines(times: Mapping[str, float | Exception], nbytes: float, copy_gbps: float,
                    width: int = 36) -> list[str]:
    """One line per case of ``time_interleaved``'s results for a bandwidth probe: time (us),
    GB/s of ``nbytes`` and that rate as a percentage of ``copy_gbps``, or the case's error."""
    lines = []
    for name, t in times.items():
        if isinstance(t, float):
            gbps = nbytes / (t * 1e-6) / 1e9
            lines.append(f"{name:{width}s} {t:8.1f} us {gbps:7.0f} GB/s {100 * gbps / copy_gbps:6.1f}% copy")
        else:
            lines.append(f"{name:{width}s} failed: {type(t).__name__}: {str(t)[:160]}")
    return lines


def measure_ceilings() -> dict[str, float]:
    """Copy bandwidth (GB/s, read + write) and cuBLAS bf16 / fp8 rates (TFLOP/s)."""
    dev = "cuda"
    out: dict[str, float] = {}
    n = 1 << 30  # 1 GiB per buffer
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), iters=20, use_graph=False)
    out["copy_GBps"] = 2 * n / (t * 1e-6) / 1e9
    m = n_ = k = 8192
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n_, k, device=dev, dtype=torch.bfloat16)
    t = time_fn(lambda: a @ b.t(), iters=20, use_graph=False)
    out["cublas_bf16_TFLOPs"] = 2 * m * n_ * k / (t * 1e-6) / 1e12
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    t = time_fn(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                iters=20, use_graph=False)
    out["cublas_fp8_TFLOPs"] = 2 * m * n_ * k / (t * 1e-6) / 1e12
    return out


def record(
    ceilings: dict[str, float],
    *,
    family: str,
    op: str,
    shape: str,
    impl: str,
    time_us: float | None,
    flops: float | None = None,
    nbytes: float | None = None,
    dtype: str = "",
    ceiling: str = "",
    note: str = "",
) -> dict[str, Any]:
    """One benchmark row: time, TFLOP/s, GB/s and the fractions of the measured ceilings.

    ``ceiling`` names the rate the op should be compared with (``cublas_bf16_TFLOPs``,
    ``cublas_fp8_TFLOPs`` or ``copy_GBps``); ``time_us=None`` records a peer that failed or
    is unavailable, with the reason in ``note``.
    """
    row: dict[str, Any] = {"family": family, "op": op, "shape": shape, "dtype": dtype, "impl": impl,
                           "time_us": time_us, "note": note}
    if time_us:
        if flops is not None:
            row["TFLOPs"] = flops / (time_us * 1e-6) / 1e12
        if nbytes is not None:
            row["GBps"] = nbytes / (time_us * 1e-6) / 1e9
        if ceiling and ceiling in ceilings:
            achieved = row.get("GBps") if ceiling.endswith("GBps") else row.get("TFLOPs")
            if achieved is not None:
                row["frac_ceiling"] = achieved / ceilings[ceiling]
                row["ceiling"] = ceiling
    return row


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    """``items`` with a ``tqdm`` progress bar on stderr (the ``bench`` extra installs it);
    the plain iterable when tqdm is missing or stderr is not a terminal."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, total=total, disable=None, file=sys.stderr, leave=False)
