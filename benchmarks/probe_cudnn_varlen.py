"""Probe: can ragged (varlen) dense prefill hand its eager calls to aten's cuDNN varlen op?

``flash_attn_varlen_func`` runs the Triton TMA kernel on a ragged batch. aten has a varlen
cuDNN entry point, ``_cudnn_attention_forward`` with ``cum_seq_q`` / ``cum_seq_k`` (the
nested-tensor path), which cannot be captured in a CUDA graph (session 13:
cudaErrorStreamCaptureInvalidated). This times it eagerly against mate's kernel and aten's
FA2 varlen op, checks its output and LSE against mate's fp32 reference, and checks that a
call returns to the host while the GPU is still busy (no host synchronization inside).

    python benchmarks/probe_cudnn_varlen.py [--quick]
"""

from __future__ import annotations

import sys
import time

import torch

from mate.mha_interface import flash_attn_varlen_func
from mate.ops.mha.reference import attention_varlen_reference


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _eager_us(fns: dict, rounds: int = 3, iters: int = 10) -> dict:
    """Median GPU time per call of back-to-back eager calls (events around ``iters`` calls),
    the cases interleaved round by round."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times = {n: [] for n in fns}
    for r in range(rounds):
        order = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fns[name]()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / iters)
    return {n: sorted(t)[len(t) // 2] for n, t in times.items()}


def _host_returns_early(fn) -> tuple[float, float]:
    """(host ms of one call, GPU ms still queued ahead of it): a call that synchronizes
    waits for the ~100 ms spin before it."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e3
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t1) * 1e3


def _case(lens_q, lens_k=None, H=32, HKV=8, D=128, causal=True, dtype=torch.bfloat16) -> None:
    torch.manual_seed(0)
    lens_k = lens_k or lens_q
    T, TK = sum(lens_q), sum(lens_k)
    q = torch.randn(T, H, D, device="cuda", dtype=dtype)
    k = torch.randn(TK, HKV, D, device="cuda", dtype=dtype)
    v = torch.randn(TK, HKV, D, device="cuda", dtype=dtype)
    cu_q = _cu(lens_q)
    cu_k = cu_q if lens_k is lens_q else _cu(lens_k)
    mq, mk = max(lens_q), max(lens_k)
    scale = D ** -0.5
    tag = (f"lens {lens_q[:3]}{'...' if len(lens_q) > 3 else ''} x{len(lens_q)} (T={T}"
           f"{'' if lens_k is lens_q else f', TK={TK}'}) {H}/{HKV} d{D} {'causal' if causal else 'full'}")
    ref, ref_lse = attention_varlen_reference(q, k, v, cu_q, lens_k, k_starts=cu_k.tolist()[:-1],
                                              softmax_scale=scale, causal=causal)
    ref = ref.float()

    def mate():
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_softmax_lse=True)

    def cudnn():
        return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu_q, cu_k, mq, mk, True, 0.0, causal, False,
                                                       scale=scale)

    def flash():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, mq, mk, 0.0, causal, False, scale=scale)

    fns = {"mate": mate}
    msg = [tag]
    for name, fn, lse_of in (("cudnn", cudnn, lambda r: r[1].reshape(T, H).t()),
                             ("fa2", flash, lambda r: r[1].reshape(H, T))):
        try:
            res = fn()
            out_err = (res[0].reshape(T, H, D).float() - ref).abs().max().item()
            lse_err = (lse_of(res).float() - ref_lse).abs().max().item()
            host, queued = _host_returns_early(fn)
            msg.append(f"  {name}: max|out-ref| {out_err:.2e} max|lse-ref| {lse_err:.2e}; host {host:.2f} ms "
                       f"with {queued:.0f} ms still queued")
            fns[name] = fn
        except Exception as exc:
            msg.append(f"  {name}: failed: {type(exc).__name__}: {exc}"[:300])
    o, lse = mate()
    msg.append(f"  mate: max|out-ref| {(o.float() - ref).abs().max().item():.2e} "
               f"max|lse-ref| {(lse - ref_lse).abs().max().item():.2e}")
    times = _eager_us(fns)
    flops = sum(4 * D * H * (lq * lk if not causal else lq * (lk - lq) + lq * (lq + 1) / 2)
                for lq, lk in zip(lens_q, lens_k))
    msg.append("  eager us: " + "  ".join(f"{n} {t:.1f} ({flops / t / 1e6:.0f} TFLOP/s)" for n, t in times.items()))
    print("\n".join(msg), flush=True)


def main() -> None:
    ragged = [1000, 3000, 517, 2048, 77, 4000, 1300, 1]
    _case([2048] * 8, causal=True)
    _case([2048] * 8, causal=False)
    _case(ragged, causal=True)
    _case(ragged, causal=False)
    if "--quick" in sys.argv:
        return
    _case([2048] * 8, H=32, HKV=32, causal=False)
    _case([2048] * 8, H=64, HKV=4, causal=False)
    _case([2048] * 8, D=64, causal=False)
    _case([4096] * 4, causal=False, dtype=torch.float16)
    _case([512] * 32, causal=False)
    _case([700, 300, 1200], lens_k=[2000, 4096, 100], causal=False)  # keys longer and shorter than queries
    _case([16384], causal=False)
    _case([128] * 64, causal=True)


if __name__ == "__main__":
    main()
