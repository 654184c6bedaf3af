"""Probe: ragged prefill batches of short prompts, mate against aten's FlashAttention-2 varlen op.

``probe_cudnn_varlen.py`` (session 28) timed 64 prompts of 128 tokens (causal, 32/8 heads,
d 128) eagerly at 325.8 us in mate against 114.2 in FA2. This separates GPU time (CUDA-graph
replay) from host time (a call's wall time while the GPU is kept busy); the host
side by part: ``probe_launch_overhead.py``.

    python benchmarks/probe_mha_short.py
"""

from __future__ import annotations

import torch

from mate.mha_interface import flash_attn_varlen_func
from mate.testing.bench import back_to_back_us, host_us, time_interleaved


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def case(lens, H=32, HKV=8, D=128, causal=True, lse=False) -> None:
    torch.manual_seed(0)
    T = sum(lens)
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16)
    cu = _cu(lens)
    mx = max(lens)
    out = torch.empty_like(q)

    def mate():
        return flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal, return_softmax_lse=lse, out=out)

    def fa2():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, causal, False)

    o_m = mate()
    o_m = o_m[0] if lse else o_m
    err = (o_m.float() - fa2()[0].float()).abs().max().item()
    g = time_interleaved({"mate": mate, "fa2": fa2}, rounds=5, iters=50)
    e = {"mate": back_to_back_us(mate), "fa2": back_to_back_us(fa2)}
    h = {"mate": host_us(mate, calls=20), "fa2": host_us(fa2, calls=20)}
    flops = sum(4 * D * H * (n * (n + 1) / 2 if causal else n * n) for n in lens)
    desc = f"{len(lens)} x {lens[0]}" if len(set(lens)) == 1 else f"{len(lens)} lens {lens[:4]}..."
    print(f"{desc} {H}/{HKV} {'causal' if causal else 'full'}{' lse' if lse else ''} (T={T}, max|mate-fa2| {err:.1e}): "
          + "  ".join(f"{n}: graph {g[n]:.1f} ({flops / g[n] / 1e6:.0f} TFLOP/s) eager {e[n]:.1f} host {h[n]:.1f}"
                      for n in ("mate", "fa2")), flush=True)


def main() -> None:
    case([128] * 64)
    case([128] * 64, lse=True)
    case([64] * 128)
    case([256] * 32)
    case([512] * 32)
    case([512] * 32, causal=False)
    case([1024] * 16)
    g = torch.Generator().manual_seed(3)
    case(torch.randint(16, 600, (48,), generator=g).tolist())
    case([128] * 64, H=64, HKV=4)
    case([2048] * 8)


if __name__ == "__main__":
    main()
