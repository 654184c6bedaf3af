"""Grouped FP8 GEMM at its boundaries, for compute-sanitizer (GPU).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_gemm.py

The masked layout with max_m not a multiple of the 64-row tile (the last tile of a group
reads the next group's rows, and past the tensor for the last group), masked_m 0, 1, max_m
and an expected_m far from the counts, N not a multiple of 128; the contiguous layout with
padding rows, an empty expert and one-row experts. Every valid row is compared with the
reference and every row past masked_m must keep its NaN poison; the script exits non-zero
on a mismatch. H200 run: session 21 (0 errors; ``2026-11-30-h200-s21-probes.txt``).
"""

from __future__ import annotations

import sys

import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.testing.inputs import grouped_contiguous_operands

K = 1024


def _fp8(*shape) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    if ref.numel() == 0:  # masked_m 0: no valid row
        return out.numel() == 0
    return bool(torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max())))


def masked(G: int, max_m: int, n: int, expected_m: int, counts: list[int]) -> bool:
    a, b = _fp8(G, max_m, K), _fp8(G, n, K)
    sa = torch.rand(G, max_m, K // 128, device="cuda") * 0.02 + 0.005
    sb = torch.rand(G, -(-n // 128), K // 128, device="cuda") * 0.02 + 0.005
    mm = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((G, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm.batch_deepgemm_fp8_nt_groupwise(a, b, sa, sb, mm, expected_m, out=out)
    ref = R.masked_ref(a, b, sa, sb, mm, torch.float32)
    return all(_close(out[g, :r], ref[g, :r]) and bool(torch.isnan(out[g, r:].float()).all())
               for g, r in enumerate(counts))


def contiguous(rows: list[int], n: int) -> bool:
    idx, a, sa, b, sb = grouped_contiguous_operands(rows, n, K, device="cuda")  # rows padded to 128 with -1
    out = torch.full((idx.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, idx, out=out)
    ref = R.grouped_contiguous_ref(a, b, sa, sb, idx, torch.float32)
    valid = idx >= 0
    return _close(out[valid], ref[valid])


def main() -> int:
    torch.manual_seed(0)
    cases = [
        ("masked 3 x 100, N=384, expected 50", lambda: masked(3, 100, 384, 50, [100, 37, 99])),
        ("masked 4 x 64, N=256, expected 300", lambda: masked(4, 64, 256, 300, [64, 0, 1, 63])),
        ("masked 2 x 200, N=4160, expected 128", lambda: masked(2, 200, 4160, 128, [200, 129])),
        ("contiguous [300, 0, 128, 517], N=384", lambda: contiguous([300, 0, 128, 517], 384)),
        ("contiguous [1, 64, 65], N=4224", lambda: contiguous([1, 64, 65], 4224)),
    ]
    failed = 0
    for name, case in cases:
        ok = case()
        torch.cuda.synchronize()
        print(("ok   " if ok else "FAIL ") + name, flush=True)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
