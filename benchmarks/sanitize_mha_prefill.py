"""The TMA prefill attention kernel (``mate/ops/mha/prefill_tma.py``) for compute-sanitizer (GPU).

    compute-sanitizer --tool memcheck --error-exitcode 9 python benchmarks/sanitize_mha_prefill.py

Runs the mha tests' checks on the GPU with every prefill routed to the TMA kernel
(``min_seqlen_q=1``): ragged GQA causal, seqused_k, a right window, ragged offsets outside q and
k, a batched cache, paged caches of 64- and 128-key pages, lengths near INT32_MAX; each compared
with the reference, each counted to reach the kernel. Then (session 27) the GPU test's mixed
batches at the default ``min_seqlen_q`` (64): decode rows and short chunks on the packed-heads
kernel beside the TMA kernel's requests, ragged and paged. Exits non-zero on a failed check.
H200, session 26: every check passed, 10 calls, 0 memcheck errors (the session's probes file).
"""
import os
import sys

os.environ["MATE_MHA_PREFILL_TMA"] = "min_seqlen_q=1"
sys.path.insert(0, ".")
import torch  # noqa: E402

import tests.mha.test_mha_interface as t  # noqa: E402
from mate.ops.mha import attention, prefill_tma  # noqa: E402

calls = []
real = attention.attention_prefill_tma
attention.attention_prefill_tma = lambda *a, **kw: calls.append(1) or real(*a, **kw)
checks = {
    "ragged causal GQA": lambda: t.check_varlen_dense("cuda", torch.bfloat16, 8, 2, 64, True, (-1, -1), False),
    "ragged full seqused d128": lambda: t.check_varlen_dense("cuda", torch.float16, 4, 4, 128, False, (-1, -1), True),
    "right window": lambda: t.check_varlen_dense("cuda", torch.bfloat16, 4, 2, 64, False, (-1, 5), True),
    "offsets outside": lambda: t.check_offsets_outside_the_tensors("cuda"),
    "batched cache": lambda: t.check_kvcache("cuda", paged=False, sq=3),
    "paged 64": lambda: t.check_varlen_paged("cuda", 64),
    "paged 128": lambda: t.check_varlen_paged("cuda", 128),
    "INT32_MAX lengths": lambda: t.check_lengths_near_int32_max("cuda"),
}


def _mixed(paged: bool):
    def run():
        prefill_tma.PREFILL_TMA["min_seqlen_q"] = 64
        try:
            t.test_mixed_batch_gpu(paged, 32, 8, None, None)
        finally:
            prefill_tma.PREFILL_TMA["min_seqlen_q"] = 1
    return run


checks.update({"mixed batch ragged": _mixed(False), "mixed batch paged": _mixed(True)})
bad = 0
for name, fn in checks.items():
    before = len(calls)
    try:
        fn()
        torch.cuda.synchronize()
        print(f"{name}: ok, {len(calls) - before} calls through the TMA kernel", flush=True)
    except Exception as exc:  # noqa: BLE001
        bad += 1
        print(f"{name}: FAILED {type(exc).__name__}: {exc}"[:300], flush=True)
sys.exit(1 if bad else 0)
