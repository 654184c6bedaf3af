"""The benchmark helpers of ``mate.testing.bench``: result rows, input rotation, and (on
the GPU) timing; plus API logging under CUDA-graph capture, which only a GPU can show."""

from __future__ import annotations

import math

import pytest
import torch

from mate.testing.bench import (
    L2_BYTES,
    bandwidth_lines,
    interleave_order,
    progress,
    record,
    rotation_count,
    time_fn,
    time_interleaved,
)

CEILINGS = {"copy_GBps": 4000.0, "cublas_bf16_TFLOPs": 800.0}


def test_record_rates_and_fractions():
    row = record(CEILINGS, family="gemm", op="bmm_bf16", shape="8x4096x4096x4096", impl="mate", time_us=100.0,
                 flops=4e10, nbytes=2e8, dtype="bf16", ceiling="cublas_bf16_TFLOPs", note="n")
    assert row["TFLOPs"] == pytest.approx(400.0)  # 4e10 flop in 1e-4 s
    assert row["GBps"] == pytest.approx(2000.0)  # 2e8 B in 1e-4 s
    assert row["frac_ceiling"] == pytest.approx(0.5) and row["ceiling"] == "cublas_bf16_TFLOPs"
    assert {k: row[k] for k in ("family", "op", "shape", "dtype", "impl", "time_us", "note")} == {
        "family": "gemm", "op": "bmm_bf16", "shape": "8x4096x4096x4096", "dtype": "bf16", "impl": "mate",
        "time_us": 100.0, "note": "n"}
    row = record(CEILINGS, family="f", op="o", shape="s", impl="mate", time_us=50.0, nbytes=1e8, ceiling="copy_GBps")
    assert row["GBps"] == pytest.approx(2000.0) and row["frac_ceiling"] == pytest.approx(0.5)
    assert "TFLOPs" not in row


def test_record_missing_peer_and_unknown_ceiling():
    row = record(CEILINGS, family="f", op="o", shape="s", impl="FlashMLA", time_us=None, flops=1e9,
                 ceiling="copy_GBps", note="flash_mla not importable")
    assert row["time_us"] is None and row["note"] == "flash_mla not importable"
    assert not {"TFLOPs", "GBps", "frac_ceiling", "ceiling"} & set(row)
    row = record({}, family="f", op="o", shape="s", impl="mate", time_us=10.0, flops=1e9, ceiling="copy_GBps")
    assert "frac_ceiling" not in row and row["TFLOPs"] == pytest.approx(100.0)  # 1e9 flop in 1e-5 s


def test_progress_yields_every_item(monkeypatch):
    """With tqdm (a bar on a terminal, none here: stderr is captured) or without it."""
    assert list(progress(range(4), "items")) == [0, 1, 2, 3]
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kw):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    items = ["a", "b"]
    assert progress(items, "items") is items


def test_bandwidth_lines_rates_and_errors():
    lines = bandwidth_lines({"fast": 50.0, "broken": RuntimeError("no kernel")}, nbytes=1e8, copy_gbps=4000.0,
                            width=8)
    assert lines[0].split() == ["fast", "50.0", "us", "2000", "GB/s", "50.0%", "copy"]  # 1e8 B in 50 us
    assert lines[1] == "broken   failed: RuntimeError: no kernel"


def test_rotation_count():
    total = 4 * L2_BYTES
    assert rotation_count(total) == 1
    assert rotation_count(total // 3) == 3
    assert rotation_count(total // 3 - 1) == 4  # rounded up: the sets together reach 4 L2 sizes
    assert rotation_count(1) == 64  # capped
    assert rotation_count(0) == 1 and rotation_count(10 * total) == 1


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 6, 7])
def test_interleave_order_balances_predecessors(n):
    """Every round replays each case once; over the design's rounds (n, or 2n for odd n) each
    case starts a round and directly follows every other case (a rotation keeps one predecessor)."""
    names = [f"c{i}" for i in range(n)]
    rounds = n if n % 2 == 0 else 2 * n
    orders = [interleave_order(names, r) for r in range(max(rounds, 1))]
    for order in orders:
        assert sorted(order) == sorted(names)
    if n == 0:
        return
    assert {order[0] for order in orders} == set(names)
    follows = {(order[i - 1], order[i]) for order in orders for i in range(1, n)}
    assert follows == {(a, b) for a in names for b in names if a != b}
    assert interleave_order(names, rounds) == orders[0]  # the design repeats


@pytest.mark.gpu
def test_time_fn_on_the_gpu():
    x = torch.randn(1 << 24, device="cuda")
    ys = [torch.empty_like(x) for _ in range(3)]
    fns = [lambda y=y: y.copy_(x) for y in ys]
    t_graph = time_fn(fns, iters=20)
    t_events = time_fn(fns[0], iters=20, use_graph=False)
    for t in (t_graph, t_events):
        assert math.isfinite(t) and t > 0
    # 128 MiB read + written: between 1 us and 10 ms on any GPU of this decade
    assert 1.0 < t_graph < 1e4 and 1.0 < t_events < 1e4


@pytest.mark.gpu
def test_time_interleaved_on_the_gpu():
    x = torch.randn(1 << 24, device="cuda")
    small, big = torch.empty(1 << 20, device="cuda"), torch.empty_like(x)

    def broken():
        raise RuntimeError("peer unavailable")

    times = time_interleaved({"big": lambda: big.copy_(x), "small": lambda: small.copy_(x[: 1 << 20]),
                              "broken": broken}, rounds=3, iters=12)
    assert list(times) == ["big", "small", "broken"]
    assert isinstance(times["broken"], RuntimeError)
    # 16x the bytes: clearly slower, both finite
    assert 0 < times["small"] < times["big"] < 1e4


@pytest.mark.gpu
def test_host_and_back_to_back_times():
    from mate.testing.bench import back_to_back_us, host_us

    x = torch.randn(1 << 24, device="cuda")
    y = torch.empty_like(x)
    calls = []

    def copy():
        calls.append(1)
        y.copy_(x)

    host = host_us(copy, calls=50, rounds=2)
    eager = back_to_back_us(copy, iters=10, repeats=3)
    assert len(calls) == 1 + 2 * 50 + 3 * (3 + 10)
    # a 64 MB copy takes ~30 us of GPU time and a few us of host time: back to back, the GPU time counts
    assert 0 < host < eager < 1e4

@pytest.mark.gpu
def test_logging_under_cuda_graph_capture(run_py, tmp_path):
    proc = run_py(
        """
        import torch, _demo_ops
        x = torch.randn(4, 6, device="cuda")
        out = torch.empty(4, 6, device="cuda")
        _demo_ops.scale_rows(x, 2.0, out=out)  # call 1: logged with statistics and dumped
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            _demo_ops.scale_rows(x, 3.0, out=out)  # call 2: no statistics, no dump while capturing
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x * 3.0)
        print("done")
        """,
        MATE_LOGLEVEL="10", MATE_LOGDEST="stdout", MATE_DUMP_DIR=str(tmp_path / "d"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = proc.stdout
    first, second = log.split("[mate] call #2 _demo_ops.scale_rows")
    assert "nan=0, inf=0}" in first and "{min=" not in second and "nan=" not in second
    assert "logging failed" not in log
    dirs = [p.name for p in (tmp_path / "d").iterdir() if p.is_dir()]
    assert len(dirs) == 1 and dirs[0].endswith("_scale_rows_call0001")


def test_times_line():
    from mate.testing.bench import times_line

    line = times_line({"a": 10.0, "b": RuntimeError("no peer")}, flops=2e7)
    assert line == "a 10.0 us 2 TF  b no peer"
