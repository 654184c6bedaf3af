"""Probe: where the host time of an eager ``flash_attn_varlen_func`` call goes.

``probe_mha_short.py`` (session 28) measured about 250 us of host time per call on a ragged
batch (64 x 128 tokens, causal, 32/8 heads) against 20 us for aten's FA2 varlen op; the GPU
time is about equal. A ragged call makes three Triton launches (the TMA kernel and two
packed-heads launches for short requests). This times, with the GPU kept busy so that
nothing waits on it: the whole call; the call with every Triton launch replaced by a no-op
(mate's own Python); and each kernel's launch through ``JITFunction`` against its parts
(the argument binder, ``CompiledKernel[grid]`` and ``CompiledKernel.run`` called directly).

    python benchmarks/probe_launch_overhead.py
"""

from __future__ import annotations

import torch
import triton

import mate.ops.mha.attention as A
import mate.ops.mha.prefill_tma as P
from mate.mha_interface import flash_attn_varlen_func
from mate.testing.bench import host_us


class Recorder:
    """Stands in for a JIT kernel: records the last launch, or launches nothing (``stub``)."""

    def __init__(self, kernel, stub=False):
        self.kernel, self.stub, self.calls = kernel, stub, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            if not self.stub:
                return self.kernel[grid](*args, **kwargs)
        return launch


def parts(name: str, kernel, grid, args, kwargs) -> None:
    dev = torch.cuda.current_device()
    compiled = kernel[grid](*args, **kwargs)
    binder = kernel.device_caches[dev][4]
    bound, _spec, _opts = binder(*args, **kwargs)
    vals = list(bound.values())
    g = tuple(grid) + (1,) * (3 - len(grid))
    stream = torch.cuda.current_stream().cuda_stream
    fn, meta = compiled.function, compiled.packed_metadata
    res = {
        "JITFunction[grid](...)": host_us(lambda: kernel[grid](*args, **kwargs)),
        "binder only": host_us(lambda: binder(*args, **kwargs)),
        "CompiledKernel[grid](...)": host_us(lambda: compiled[g](*vals)),
        "CompiledKernel.run direct": host_us(lambda: compiled.run(g[0], g[1], g[2], stream, fn, meta, None, None, None,
                                                                  *vals)),
    }
    print(f"  {name} ({len(vals)} arguments): " + "  ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)


def main() -> None:
    lens = [128] * 64
    T = sum(lens)
    q = torch.randn(T, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def call():
        return flash_attn_varlen_func(q, k, v, cu, cu, 128, 128, causal=True, out=out)

    print(f"triton {triton.__version__}, torch {torch.__version__}")
    print(f"whole call: {host_us(call):.1f} us host")
    fwd, tma = A._mha_fwd_kernel, P._mha_prefill_tma_kernel
    rec_fwd, rec_tma = Recorder(fwd), Recorder(tma)
    A._mha_fwd_kernel, P._mha_prefill_tma_kernel = Recorder(fwd, stub=True), Recorder(tma, stub=True)
    try:
        print(f"launches replaced by no-ops: {host_us(call):.1f} us host")
        A._mha_fwd_kernel, P._mha_prefill_tma_kernel = rec_fwd, rec_tma
        call()
        torch.cuda.synchronize()
    finally:
        A._mha_fwd_kernel, P._mha_prefill_tma_kernel = fwd, tma
    parts("TMA kernel", tma, *rec_tma.calls[-1])
    for grid, args, kwargs in rec_fwd.calls:
        parts(f"packed-heads kernel, grid {grid}", fwd, grid, args, kwargs)


if __name__ == "__main__":
    main()
