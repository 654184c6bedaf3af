"""Probe: can ragged (varlen) dense prefill use torch's cuDNN or flash attention ops?

``flash_attn_varlen_func`` runs the Triton kernel on a ragged batch: 8 x 2048 causal in
876.7 us against 683.0 for one cuDNN SDPA call per sequence (session 13). aten has varlen
entry points: ``_cudnn_attention_forward`` (``cum_seq_q`` / ``cum_seq_k``, the nested-tensor
path) and ``_flash_attention_forward`` (FlashAttention-2, ``cum_seq_*``, ``seqused_k``,
windows). This calls each on packed [total, H, D] tensors, compares output and LSE with
mate's kernel, and times them interleaved with mate and the per-sequence SDPA loop.

    python benchmarks/probe_cudnn_varlen.py [--eager]
"""

from __future__ import annotations

import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mate.mha_interface import flash_attn_varlen_func
from mate.testing.bench import time_fn, time_interleaved


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _case(lens, H=32, HKV=32, D=128) -> None:
    torch.manual_seed(0)
    T = sum(lens)
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16)
    cu = _cu(lens)
    mx = max(lens)
    scale = D ** -0.5
    ref, ref_lse = flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=True, return_softmax_lse=True)
    print(f"lens {lens[:4]}{'...' if len(lens) > 4 else ''} (T={T}) H={H}/{HKV}:", flush=True)

    def cudnn():
        return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, mx, mx, True, 0.0, True, False,
                                                       scale=scale)

    def flash():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, True, False, scale=scale)

    cases = {"mate (Triton)": lambda: flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=True)}
    for name, fn in (("cuDNN varlen", cudnn), ("flash varlen", flash)):
        try:
            res = fn()
            o, lse = res[0], res[1]
            od = (o.reshape(T, H, D).float() - ref.float()).abs().max().item()
            msg = f"  {name}: out {tuple(o.shape)} strides {o.stride()}, lse {tuple(lse.shape)} strides {lse.stride()}"
            msg += f"; max |out - mate| {od:.3e}"
            for cand, tag in ((lse.reshape(H, T) if lse.numel() == H * T else None, "[H, T]"),
                              (lse.reshape(T, H).t() if lse.numel() == H * T else None, "[T, H]")):
                if cand is not None:
                    msg += f"; lse as {tag} max diff {(cand.float() - ref_lse).abs().max().item():.3e}"
            print(msg, flush=True)
            cases[name] = fn
        except Exception as exc:
            print(f"  {name}: failed: {type(exc).__name__}: {exc}"[:400], flush=True)

    qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))
    starts = cu.tolist()

    def per_sequence():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for a, b in zip(starts[:-1], starts[1:]):
                torch.nn.functional.scaled_dot_product_attention(qt[:, :, a:b], kt[:, :, a:b], vt[:, :, a:b],
                                                                 is_causal=True, enable_gqa=H != HKV)

    cases["SDPA cuDNN per sequence"] = per_sequence
    if EAGER:  # cuDNN's varlen op cannot be captured in a CUDA graph: each case timed eagerly
        line = []
        for name, fn in cases.items():
            try:
                line.append(f"{name} {time_fn(fn, iters=20, use_graph=False):.1f} us")
            except Exception as exc:
                line.append(f"{name} {type(exc).__name__}: {exc}"[:120])
        print("  eager: " + "  ".join(line), flush=True)
        return
    times = time_interleaved(cases, rounds=5, iters=10)
    print("  " + "  ".join(f"{n} {t:.1f} us" if isinstance(t, float) else f"{n} {t}" for n, t in times.items()),
          flush=True)


EAGER = "--eager" in sys.argv


def main() -> None:
    _case([2048] * 8)
    _case([1000, 3000, 517, 2048, 77, 4000, 1300, 1])
    _case([2048] * 8, H=32, HKV=8)


if __name__ == "__main__":
    main()
