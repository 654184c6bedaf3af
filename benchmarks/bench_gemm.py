"""GEMM benchmarks: groupwise FP8 on DeepSeek-V3 shapes, MoE grouped (contiguous and masked),
bmm_bf16 / bmm_fp8, against cuBLAS (torch._scaled_mm / torch.bmm) and DeepGEMM when it loads.

``run(ceilings, quick)`` returns rows built with :func:`mate.testing.bench.record`; the
runner is ``benchmarks/run_gpu.py``. A time budget (``MATE_BENCH_BUDGET_S``, default 150 s)
stops adding shapes once spent; skipped shapes get a row with a note.
"""

from __future__ import annotations

import os
import time
import traceback

import torch

from mate import gemm
from mate.testing.bench import record, rotation_count, time_interleaved
from mate.testing.inputs import moe_contiguous_operands, moe_masked_operands

FAMILY = "gemm"
CEIL = "cublas_fp8_TFLOPs"
M_FULL = (1, 16, 32, 64, 128, 512, 4096, 16384)
NK_FULL = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
M_QUICK = (1, 16, 32, 64, 128, 4096)
NK_QUICK = ((2112, 7168), (4096, 7168), (24576, 1536), (7168, 2048))


def _deep_gemm():
    try:
        import deep_gemm

        return deep_gemm, ""
    except Exception as exc:  # a peer that fails to load gets rows with the reason
        return None, f"deep_gemm import failed: {type(exc).__name__}: {exc}"[:200]


def _operands(m, n, k, sets):
    out = []
    for _ in range(sets):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(m, k // 128, device="cuda") * 0.01 + 0.001
        sb = torch.rand(-(-n // 128), k // 128, device="cuda") * 0.01 + 0.001
        out.append((a, b, sa, sb))
    return out


def _case(impl: str, fns, *, op: str, dtype: str = "e4m3->bf16", note: str = "", ceiling: str = CEIL) -> dict:
    """One implementation of a benchmark shape: its calls (one per rotated input set; None
    when it cannot run, with the reason in ``note``) and the fields of its row."""
    return {"impl": impl, "fns": fns, "op": op, "dtype": dtype, "note": note, "ceiling": ceiling}


def _timed_rows(ceilings: dict, shape: str, flops: float, cases: list[dict]) -> list[dict]:
    """Times the runnable cases interleaved (``time_interleaved``: mate and its peers under
    the same clocks and L2 state) and returns one row per case, in order. 10 rounds of 20
    replays: with the default 5 x 10, two identical ``torch._scaled_mm`` calls (mate's cuBLAS
    row and the peer's at M=N=4096, K=7168) read 3% apart under the large GEMMs' power-limited
    clocks; 10 x 20 in a dedicated run read them within 0.5% (197.6 against 198.1 us, either order)."""
    times = time_interleaved({str(i): c["fns"] for i, c in enumerate(cases) if c["fns"]}, rounds=10, iters=200)
    rows = []
    for i, c in enumerate(cases):
        t, note = times.get(str(i)), c["note"]
        if isinstance(t, Exception):
            t, note = None, f"{type(t).__name__}: {t}"[:200]
        rows.append(record(ceilings, family=FAMILY, op=c["op"], shape=shape, impl=c["impl"], time_us=t,
                           flops=flops, dtype=c["dtype"], ceiling=c["ceiling"], note=note))
    return rows


def _groupwise_rows(ceilings, m, n, k, dg, dg_note):
    flops = 2.0 * m * n * k
    per_set = m * k + n * k + 2 * m * n
    sets = _operands(m, n, k, rotation_count(per_set, max_sets=16))
    shape = f"M={m} N={n} K={k}"
    op = "gemm_fp8_nt_groupwise"
    outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in sets]
    # "MN" mode with the layouts every backend reads in place: the activation scale M-major
    # (as a per-token-group quantizer writes it) and the weight scale the transposed view of
    # the checkpoint's K-major [nb, kb]
    mn = [(a, b, sa.t().contiguous(), sb.t()) for a, b, sa, sb in sets]
    from mate.ops.gemm import tuning

    cases = []
    for impl, backend in (("mate-auto", "auto"), ("mate-triton", "triton"), ("mate-cublas", "cublas")):
        fns = [lambda x=x, o=o, be=backend: gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="MN", out=o, backend=be)
               for x, o in zip(mn, outs)]
        note = f"auto->{tuning.groupwise_backend(m, n, k)}" if impl == "mate-auto" else ""
        cases.append(_case(impl, fns, op=op, note=note))
    # K-major scales through the Triton kernel (read in place)
    cases.append(_case("mate-triton-Kmajor", [
        lambda x=x, o=o: gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="K", out=o, backend="triton")
        for x, o in zip(sets, outs)], op=op))
    # FP8 output with fused quantization
    o8 = [torch.empty(m, n, dtype=torch.float8_e4m3fn, device="cuda") for _ in sets]
    os_ = [torch.empty(m, -(-n // 128), device="cuda") for _ in sets]
    cases.append(_case("mate-auto", [
        lambda x=x, o=o, s=s: gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="K", out=o, output_scale=s)
        for x, o, s in zip(sets, o8, os_)], op=f"{op}(fp8 out)", dtype="e4m3->e4m3"))
    # cuBLAS blockwise with scales pre-laid out (outside the timed region)
    cb = [(a, b.t(), sa.t().contiguous().t(), sb.t()) for a, b, sa, sb in sets]
    cases.append(_case("cublas-blockwise", [
        lambda x=x, o=o: torch._scaled_mm(x[0], x[1], scale_a=x[2], scale_b=x[3], out_dtype=torch.bfloat16, out=o)
        for x, o in zip(cb, outs)], op=op))
    # DeepGEMM with its scale layout prepared outside the timed region
    if dg is None or m > 128:  # DeepGEMM JIT-compiles per shape (~6 s): measured where its bar applies
        cases.append(_case("deepgemm", None, op=op, note=dg_note or "not run at M > 128 (JIT time)"))
    else:
        try:
            prepared = [(a, dg.get_mn_major_tma_aligned_tensor(sa), b, sb) for a, b, sa, sb in sets]
            cases.append(_case("deepgemm", [lambda x=x, o=o: dg.fp8_gemm_nt((x[0], x[1]), (x[2], x[3]), o)
                                            for x, o in zip(prepared, outs)], op=op))
        except Exception:
            cases.append(_case("deepgemm", None, op=op, note=traceback.format_exc()[-200:]))
    return _timed_rows(ceilings, shape, flops, cases)


def _grouped_rows(ceilings, G, rows_per_group, n, k, dg, dg_note):
    m = G * rows_per_group
    a, sa, b, sb, idx = moe_contiguous_operands(G, rows_per_group, n, k)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    op = "group_deepgemm (contiguous)"
    cases = [_case("mate", lambda: gemm.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, idx, out=out), op=op)]
    if dg is None:
        cases.append(_case("deepgemm", None, op=op, note=dg_note))
    else:
        try:
            sa_dg = dg.get_mn_major_tma_aligned_tensor(sa)
            cases.append(_case("deepgemm", lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a, sa_dg), (b, sb), out, idx),
                               op=op))
        except Exception:
            cases.append(_case("deepgemm", None, op=op, note=traceback.format_exc()[-200:]))
    return _timed_rows(ceilings, f"G={G} x {rows_per_group} rows N={n} K={k}", 2.0 * m * n * k, cases)


def _masked_rows(ceilings, G, max_m, expected_m, n, k, dg, dg_note):
    a, sa, b, sb, masked_m = moe_masked_operands(G, max_m, expected_m, n, k)
    out = torch.empty(G, max_m, n, dtype=torch.bfloat16, device="cuda")
    flops = 2.0 * int(masked_m.sum()) * n * k  # valid rows only
    op = "batch_deepgemm (masked)"
    cases = [_case("mate", lambda: gemm.batch_deepgemm_fp8_nt_groupwise(a, b, sa, sb, masked_m, expected_m, out=out),
                   op=op)]
    if dg is None:
        cases.append(_case("deepgemm", None, op=op, note=dg_note))
    else:
        try:
            sa_dg = dg.get_mn_major_tma_aligned_tensor(sa)
            cases.append(_case("deepgemm", lambda: dg.m_grouped_fp8_gemm_nt_masked((a, sa_dg), (b, sb), out, masked_m,
                                                                                  expected_m), op=op))
        except Exception:
            cases.append(_case("deepgemm", None, op=op, note=traceback.format_exc()[-200:]))
    return _timed_rows(ceilings, f"G={G} max_m={max_m} expected_m={expected_m} N={n} K={k}", flops, cases)


def _bmm_rows(ceilings, b, m, n, k):
    # rotated input sets as in the other rows: one set of b=8 512x512x4096 (67 MB) is about
    # the L2 size, so with a single set each row's time depended on what ran before it
    sets = []
    for _ in range(rotation_count(2 * b * (m * k + n * k + m * n), max_sets=8)):
        At = torch.randn(b, m, k, device="cuda", dtype=torch.bfloat16)
        Btt = torch.randn(b, n, k, device="cuda", dtype=torch.bfloat16)
        sets.append((At, Btt.transpose(1, 2), torch.empty(b, m, n, device="cuda", dtype=torch.bfloat16)))
    flops = 2.0 * b * m * n * k
    shape = f"b={b} m={m} n={n} k={k}"
    bf = "cublas_bf16_TFLOPs"
    cases = [_case(impl, [lambda s=s, fn=fn: fn(*s) for s in sets], op="bmm_bf16", dtype="bf16", ceiling=bf)
             for impl, fn in (("cublas", lambda A, B, o: torch.bmm(A, B, out=o)),
                              ("mate-auto", lambda A, B, o: gemm.bmm_bf16(A, B, out=o)),
                              ("mate-triton", lambda A, B, o: gemm.bmm_bf16(A, B, out=o, backend="triton")))]
    rows = _timed_rows(ceilings, shape, flops, cases)
    # FP8: the same rotated sets in e4m3 (B column-major per batch, as cuBLAS takes it)
    sets8 = [(A.to(torch.float8_e4m3fn), B.transpose(1, 2).to(torch.float8_e4m3fn).transpose(1, 2), o)
             for A, B, o in sets]
    del sets
    sa, sb = torch.ones(1, device="cuda"), torch.ones(1, device="cuda")
    sa0, sb0 = sa.reshape(()), sb.reshape(())
    sac = torch.ones(b, m, 1, device="cuda")
    sbc = torch.ones(b, 1, n, device="cuda")

    def cublas_loop(A8, B8, out):
        for i in range(b):
            torch._scaled_mm(A8[i], B8[i], scale_a=sa0, scale_b=sb0, out_dtype=torch.bfloat16, out=out[i])

    impls = (("mate-auto", lambda A8, B8, o: gemm.bmm_fp8(A8, B8, sa, sb, torch.bfloat16, out=o)),
             ("mate-triton", lambda A8, B8, o: gemm.bmm_fp8(A8, B8, sa, sb, torch.bfloat16, out=o, backend="triton")),
             ("mate-channelwise", lambda A8, B8, o: gemm.bmm_fp8(A8, B8, sac, sbc, torch.bfloat16, out=o)),
             ("cublas", cublas_loop))
    cases = [_case(impl, [lambda s=s, fn=fn: fn(*s) for s in sets8], op="bmm_fp8") for impl, fn in impls]
    return rows + _timed_rows(ceilings, shape, flops, cases)


def run(ceilings: dict, quick: bool = False) -> list[dict]:
    budget = float(os.environ.get("MATE_BENCH_BUDGET_S", "150"))
    t0 = time.time()
    dg, dg_note = _deep_gemm()
    rows: list[dict] = []

    def spent() -> bool:
        return time.time() - t0 > budget

    jobs = []
    # the bar shapes first, so a short budget still measures them
    jobs.append(("grouped", (4, 8192, 4096, 7168)))
    jobs.append(("masked", (64, 128, 64, 4096, 7168)))
    ms = M_QUICK if quick else M_FULL
    for m in sorted(ms, key=lambda m: (m > 128, m != 64, m)):  # M=64 first, large M last
        for n, k in (NK_QUICK if quick else NK_FULL):
            jobs.append(("groupwise", (m, n, k)))
    jobs.append(("bmm", (8, 512, 512, 4096)))
    jobs.append(("bmm", (1, 4096, 4096, 4096)))
    if not quick:
        for G, rpg, n, k in ((8, 1024, 4096, 7168), (32, 256, 7168, 2048), (256, 128, 7168, 2048)):
            jobs.append(("grouped", (G, rpg, n, k)))
        for G, mm, em in ((32, 256, 128), (256, 64, 32)):
            jobs.append(("masked", (G, mm, em, 4096, 7168)))
    for kind, args in jobs:
        if spent():
            rows.append(record(ceilings, family=FAMILY, op=kind, shape=str(args), impl="mate", time_us=None,
                               note="skipped: benchmark time budget spent"))
            continue
        try:
            if kind == "groupwise":
                rows += _groupwise_rows(ceilings, *args, dg, dg_note)
            elif kind == "grouped":
                rows += _grouped_rows(ceilings, *args, dg, dg_note)
            elif kind == "masked":
                rows += _masked_rows(ceilings, *args, dg, dg_note)
            else:
                rows += _bmm_rows(ceilings, *args)
        except Exception:
            rows.append(record(ceilings, family=FAMILY, op=kind, shape=str(args), impl="mate", time_us=None,
                               note=traceback.format_exc()[-300:]))
        torch.cuda.empty_cache()
    return rows
