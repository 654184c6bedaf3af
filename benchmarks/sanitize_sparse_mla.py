"""Adversarial-index run of ``sparse_mla_fp8_decode`` for compute-sanitizer (GPU).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_sparse_mla.py

Small caches sized exactly (so any read past a row would leave the allocation), indices
at every boundary (-1, INT32_MIN, INT32_MAX, tokens, tokens - 1), seq_lens below 0 and
above top-k, an empty cache, every kernel variant (small-H transposed, H >= 64, with and
without the split + combine step, seq_lens None; on a Hopper GPU the Gluon kernels too:
64 heads for H >= 64, small-H for H <= 32, its dual form for H <= 16). Each result is checked against the
reference; the script exits non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import torch

from mate.ops.sparse_mla.metadata import plan_decode
from mate.ops.sparse_mla.reference import sparse_mla_decode_reference
from mate.sparse_mla_interface import sparse_mla_fp8_decode
from mate.testing import assert_close

INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def _indices(B: int, q_len: int, top_k: int, tokens: int, gen: torch.Generator) -> torch.Tensor:
    edge = torch.tensor([-1, INT_MIN, INT_MAX, tokens, tokens + 1, tokens - 1, 0, -2, 2**30], dtype=torch.int64)
    idx = torch.randint(0, max(tokens, 1), (B, q_len, top_k), generator=gen)
    pick = torch.randint(0, len(edge), (B, q_len, top_k), generator=gen)
    use_edge = torch.rand(B, q_len, top_k, generator=gen) < 0.5
    idx = torch.where(use_edge, edge[pick], idx)
    return idx.clamp(INT_MIN, INT_MAX).to(torch.int32)


def main() -> int:
    gen = torch.Generator().manual_seed(1234)
    failures = 0
    cases = [  # (B, q_len, H, top_k, pages, page_size, four_d, num_splits, seq_lens)
        (3, 1, 16, 128, 3, 7, False, 1, [-5, 1000, 70]),
        (2, 2, 16, 192, 2, 64, True, 3, [192, 0]),
        (2, 1, 32, 128, 1, 1, False, 2, [128, 3]),
        (2, 1, 64, 128, 5, 53, True, 1, None),
        (2, 2, 128, 256, 4, 64, False, 4, [256, 17]),
        (1, 1, 128, 64, 0, 64, False, 1, [64]),  # empty cache
    ]
    for B, q_len, H, top_k, pages, page, four_d, splits, lens in cases:
        tokens = pages * page
        q = torch.randn(B, q_len, H, 576, generator=gen).to(torch.float8_e4m3fn)
        kv = torch.randn(pages, page, 576, generator=gen).to(torch.float8_e4m3fn)
        if four_d:
            kv = kv.view(pages, 1, page, 576)
        idx = _indices(B, q_len, top_k, tokens, gen)
        sl = None if lens is None else torch.tensor(lens, dtype=torch.int32)
        ref_o, ref_l = sparse_mla_decode_reference(q, kv, idx, sl, 0.05, 1.0)
        qc, kvc, idxc = q.cuda(), kv.cuda().clone(), idx.cuda()
        slc = None if sl is None else sl.cuda()
        hopper = torch.cuda.get_device_capability()[0] == 9
        # plain kernels everywhere; on Hopper the 64-head Gluon kernel (H >= 64) or the
        # small-H Gluon kernel (H <= 32, transposed)
        variants = [dict(gluon=False)]
        if hopper:
            variants.append(dict(gluon=True) if H >= 64 else dict(gluon=True, transposed=True))
            if H <= 16:  # the one-warpgroup kernel's dual form (two chains per program)
                variants.append(dict(gluon=True, transposed=True, chains=2))
        for kw in variants:
            gluon = kw["gluon"]
            md = plan_decode(B, q_len, H, top_k, "cuda", num_splits=splits, **kw)
            out, lse = sparse_mla_fp8_decode(qc, kvc, None, 128, 512, 64, idxc, slc, 0, top_k, bmm1_scale=0.05,
                                             return_lse=True, metadata=md)
            torch.cuda.synchronize()
            what = (f"B={B} q_len={q_len} H={H} top_k={top_k} tokens={tokens} splits={md.num_splits} gluon={gluon} "
                    f"chains={md.chains} pdl={md.pdl}")
            try:
                assert_close(out, ref_o, atol=3e-3, rtol=3e-2, name="out")
                assert_close(lse, ref_l, atol=1.5e-2, rtol=2e-3, name="lse")
                print(f"ok   {what}")
            except AssertionError as exc:
                failures += 1
                print(f"FAIL {what}: {exc}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
