"""Probe: can the dense single-sequence prefill with LSE use torch's cuDNN attention?

``flash_attn_varlen_func(..., return_softmax_lse=True)`` runs the Triton kernel, 0.52x of
cuDNN SDPA at 16K causal (6530 against 3419 us, session 12), because the public SDPA call
returns no LSE. ``torch.ops.aten._scaled_dot_product_cudnn_attention`` returns one
(``compute_log_sumexp=True``). This checks its output and LSE against mate's Triton path
(shape, layout, natural log, GQA) and times both, interleaved; ``mha_interface.SDPA_WITH_LSE``
(opt-in) routes the call there once this confirms it.

    python benchmarks/probe_sdpa_lse.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mate.mha_interface import flash_attn_varlen_func
from mate.testing.bench import time_interleaved


def _case(T: int, hq: int, hkv: int, d: int = 128) -> None:
    torch.manual_seed(0)
    q = torch.randn(T, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    scale = d ** -0.5
    out, lse = flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True, return_softmax_lse=True)
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    try:
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(qh, kh, vh, None, True, 0.0, True, False,
                                                                 scale=scale)
        o_c, lse_c = res[0], res[1]
        print(f"T={T} Hq={hq} Hkv={hkv}: cuDNN out {tuple(o_c.shape)} {o_c.dtype} strides {o_c.stride()}, "
              f"lse {tuple(lse_c.shape)} {lse_c.dtype} strides {lse_c.stride()}")
        lse_c2 = lse_c.reshape(hq, T).float()
        o_diff = (o_c[0].transpose(0, 1).float() - out.float()).abs().max().item()
        l_diff = (lse_c2 - lse).abs().max().item()
        l_diff2 = (lse_c2 * 0.6931471805599453 - lse).abs().max().item()  # if it were log2
        print(f"  max |out - mate| {o_diff:.3e}, max |lse - mate| {l_diff:.3e} (as log2: {l_diff2:.3e})")
    except Exception as exc:
        print(f"T={T} Hq={hq} Hkv={hkv}: cuDNN op failed: {type(exc).__name__}: {exc}"[:300])
        return
    cases = {
        "mate (Triton, LSE)": lambda: flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True,
                                                            return_softmax_lse=True),
        "cuDNN op (LSE)": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            qh, kh, vh, None, True, 0.0, True, False, scale=scale),
        "SDPA (no LSE)": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                                                enable_gqa=hq != hkv),
    }
    times = time_interleaved(cases, rounds=5, iters=20)
    print("  " + "  ".join(f"{n} {t:.1f} us" if isinstance(t, float) else f"{n} {t}" for n, t in times.items()))


def main() -> None:
    for T, hq, hkv in ((16384, 32, 32), (4096, 32, 8), (1000, 16, 16)):
        _case(T, hq, hkv)


if __name__ == "__main__":
    main()
