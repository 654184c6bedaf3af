"""FP8-output groupwise GEMM on the H200: the fused epilogue against the bf16 path + a
quantization launch, on the benchmark's DeepSeek-V3 shapes.

    python benchmarks/probe_gemm_fp8_out.py [--m 64,128,512,4096,16384]

For each (M, N, K): ``fused`` (the Triton kernel quantizing its fp32 accumulator) and
``two-step`` (``gemm_fp8_nt_groupwise``'s bf16 path, cuBLAS or Triton/Gluon as ``auto`` picks
for bf16 output, then ``quantize_fp8_row_groups``), both through the public call with
``tuning.fp8_out_two_step`` forced, timed interleaved (CUDA-graph replays over rotated inputs,
K-major scales as ``bench_gemm``'s FP8-output rows), the bf16-output call beside them, and
which of the two ``auto`` picks. Each row also checks both outputs against the fp32 reference
(the GPU tests' tolerance, plus the bf16 rounding for the two-step path). Writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.ops.gemm import tuning
from mate.testing.bench import rotation_count, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import M_FULL, NK_FULL, _operands  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.gemm._inputs import assert_fp8_output_close  # noqa: E402

REAL = tuning.fp8_out_two_step


def _forced(two_step: bool, x, o, s):
    def call():
        with mock.patch.object(tuning, "fp8_out_two_step", lambda *args: two_step):
            gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="K", out=o, output_scale=s)
    return call


def _auto_choice(x, o, s) -> str:
    """What ``auto`` runs for this call: "two-step" when it asked ``fp8_out_two_step`` and got yes."""
    seen = []

    def spy(*args):
        seen.append(REAL(*args))
        return seen[-1]

    with mock.patch.object(tuning, "fp8_out_two_step", spy):
        gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="K", out=o, output_scale=s)
    return "two-step" if any(seen) else "fused"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default=",".join(str(m) for m in M_FULL))
    args = ap.parse_args()
    print(f"{'M':>6} {'N':>6} {'K':>6} {'fused':>8} {'two-step':>8} {'bf16':>8} {'ratio':>6} auto     check")
    for m in (int(x) for x in args.m.split(",")):
        for n, k in NK_FULL:
            sets = _operands(m, n, k, rotation_count(m * k + n * k + 3 * m * n, max_sets=16))
            o8 = [torch.empty(m, n, dtype=torch.float8_e4m3fn, device="cuda") for _ in sets]
            os_ = [torch.empty(m, -(-n // 128), device="cuda") for _ in sets]
            ob = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in sets]
            cases = {"fused": [_forced(False, *z) for z in zip(sets, o8, os_)],
                     "two-step": [_forced(True, *z) for z in zip(sets, o8, os_)],
                     "bf16": [lambda x=x, o=o: gemm.gemm_fp8_nt_groupwise(*x, scale_major_mode="K", out=o)
                              for x, o in zip(sets, ob)]}
            ref = R.groupwise_fp32_ref(*sets[0])
            checks = []
            for label, via in (("fused", False), ("two-step", True)):
                cases[label][0]()
                try:
                    assert_fp8_output_close(o8[0], os_[0], ref, via_bf16=via)
                    checks.append("ok")
                except AssertionError as exc:
                    checks.append(f"{label} BAD {str(exc)[:80]}")
            t = {key: v if isinstance(v, float) else float("nan") for key, v in time_interleaved(cases).items()}
            auto = _auto_choice(sets[0], o8[0], os_[0])
            print(f"{m:6d} {n:6d} {k:6d} {t['fused']:8.1f} {t['two-step']:8.1f} {t['bf16']:8.1f} "
                  f"{t['fused'] / t['two-step']:6.2f} {auto:<8} {' '.join(checks)}", flush=True)
            del sets, o8, os_, ob, cases
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
