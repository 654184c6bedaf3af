"""Where the small-H sparse MLA decode's time goes (B = 128, q_len 1, H = 16, top-k 2048).

    python benchmarks/probe_sparse_mla_small_h_parts.py

``bench_sparse_mla_small_h``'s inputs (random top-k entries over 1M cached tokens, 151 MB of
gathered rows). Cases, timed interleaved:

- ``default``: the public op on the default plan (the dual small-H kernel);
- ``default, L2 rows``: the same with every entry in [0, 2048) (the gathered rows stay in L2):
  the kernel's compute chain;
- ``default, sorted entries``: each query's entries sorted (neighbouring rows of one query
  gathered together);
- ``cp.async gather``: the decode's gather alone (its cp.async pieces and 64-row ring slots, no
  compute) with ``SPLIT`` programs per query, ``W`` warps and ``S`` stages;
- ``plain loads``: the same rows read by many small programs with vector loads into registers
  (``probe_gather_floor``'s best case).

H200, 2026-11-30 (copy 4260 GB/s; the 75% bar is 47.3 us): default 50.8 us (69.8%), L2 rows 44.9
(78.9%), sorted entries 49.1 (72.2%); the cp.async gather alone 38.3-39.6 us (89.4-92.5%) for
every split / stage / warp count tried (one program per query, 8 warps, 3 or 5 stages: 39.4 /
39.6); plain loads 38.0 (93.2%). The 77.5% "gather floor" of 2026-11-29 (``.devreq`` probe,
46.7 us) does not reproduce: the same gather scheme streams at ~90%, so the decode is bound by
its compute chain (44.9 us with every row in L2, 5.9 us of DRAM stalls on top), not by the
gather. ncu of the dual kernel (base clocks, 1.35 GHz: 59.9 us with random rows, 58.7 with L2
rows): issue slots 33% busy, tensor pipe active 18%, warp stalls: selected 19%, long scoreboard
18%, wait 18%, short scoreboard 11%, barrier 10%: a latency chain, two warpgroups per SM.
"""

from __future__ import annotations

import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy

from mate.ops.sparse_mla.gluon_common import _gather_tokens, _issue_gather
from mate.ops.sparse_mla.metadata import plan_decode
from mate.testing.bench import bandwidth_lines, measure_ceilings, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sparse_mla_small_h as bs  # noqa: E402
from probe_gather_floor import gather_rows_kernel  # noqa: E402


@gluon.jit
def cp_async_gather_kernel(kv_ptr, idx_ptr, out_ptr, num_tokens, top_k, SPLIT: gl.constexpr, STAGES: gl.constexpr,
                           NUM_WARPS: gl.constexpr):
    """Gathers rows [split * top_k / SPLIT, ...) of query ``b``'s entries like the decode kernels
    (64-row ring slots, cp.async, ``wait_group(STAGES - 1)`` + CTA barrier per block) and reads
    16 bytes of each landed block."""
    G_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [NUM_WARPS, 1], [1, 0])
    R_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NUM_WARPS, 1], [1, 0])
    K_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    R_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 64, 512], K_SL)
    r_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 64, 64], R_SL)
    b = gl.program_id(0).to(gl.int64)
    split = gl.program_id(1)
    rows = top_k // SPLIT
    lo = split * rows
    idx_row = idx_ptr + b * top_k
    n_iter = rows // 64
    acc = gl.zeros([64, 16], gl.float32, layout=R_L)
    tok_g, tok_r = _gather_tokens(idx_row, lo, lo + rows, 64, G_L, R_L)
    for it in range(n_iter + STAGES - 1):
        if it < n_iter:
            _issue_gather(kv_ptr, tok_g, tok_r, num_tokens, k_ring.index(it % STAGES), r_ring.index(it % STAGES),
                          512, 64, G_L, R_L)
            tok_g, tok_r = _gather_tokens(idx_row, lo + (it + 1) * 64, lo + rows, 64, G_L, R_L)
        else:
            async_copy.commit_group()
        c = it - (STAGES - 1)
        if c >= 0:
            async_copy.wait_group(STAGES - 1)
            gl.thread_barrier()
            acc += r_ring.index(c % STAGES).slice(0, 16, dim=1).load(R_L).to(gl.float32)
            gl.thread_barrier()
    offs = gl.arange(0, 64, layout=gl.SliceLayout(1, R_L))
    gl.store(out_ptr + (b * SPLIT + split) * 64 + offs, gl.sum(acc, 1))


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    ceiling = measure_ceilings()["copy_GBps"]
    B, q_len, H = 128, 1, 16
    kv, sets = bs._inputs(B, q_len, H)
    tokens = kv.shape[0] * kv.shape[1]
    md = plan_decode(B, q_len, H, bs.TOP_K, "cuda")
    s0 = sets[0]
    l2 = dict(s0, idx=torch.randint(0, 2048, s0["idx"].shape, device="cuda", dtype=torch.int32))
    srt = [dict(s, idx=s["idx"].sort(-1).values.contiguous()) for s in sets]
    cases = {
        "default": [bs._api_fn(s, kv, md) for s in sets],
        "default, L2 rows": bs._api_fn(l2, kv, md),
        "default, sorted entries": [bs._api_fn(s, kv, md) for s in srt],
    }
    kv_rows = kv.view(-1, 576)
    out = torch.empty(B * 64 * 64, device="cuda")
    for split, stages, warps in ((1, 3, 8), (1, 5, 8), (2, 3, 4), (2, 2, 8), (4, 2, 4), (8, 2, 4), (16, 2, 4)):
        cases[f"cp.async gather SPLIT {split} S {stages} W {warps}"] = [
            (lambda s=s, split=split, stages=stages, warps=warps: cp_async_gather_kernel[(B, split)](
                kv_rows, s["idx"], out, tokens, bs.TOP_K, SPLIT=split, STAGES=stages, NUM_WARPS=warps,
                num_warps=warps)) for s in sets]
    kv_i32 = kv_rows.view(torch.int32)
    n = B * bs.TOP_K
    chk = torch.empty(n // 32, dtype=torch.int32, device="cuda")
    cases["plain loads, 32 rows per program"] = [
        (lambda s=s: gather_rows_kernel[(n // 32,)](kv_i32, s["idx"], chk, ROWS=32, R=32, num_warps=4)) for s in sets]
    for name, fns in list(cases.items()):
        try:
            for f in ([fns] if callable(fns) else fns):
                f()
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"{name}: failed {type(exc).__name__}: {str(exc)[:300]}")
            del cases[name]
    times = time_interleaved(cases, rounds=5, iters=40)
    nbytes = B * q_len * bs.TOP_K * 576
    print(f"--- B={B} q{q_len} H={H} top-k {bs.TOP_K}: {nbytes / 1e6:.0f} MB gathered; copy {ceiling:.0f} GB/s "
          f"(75% bar {nbytes / (0.75 * ceiling * 1e3):.1f} us); plan splits={md.num_splits} chains={md.chains}")
    print("\n".join(bandwidth_lines(times, nbytes, ceiling, 44)))


if __name__ == "__main__":
    main()
