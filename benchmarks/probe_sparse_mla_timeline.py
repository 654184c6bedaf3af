"""Probe (session 23): a per-program timeline of the small-H sparse MLA dual kernel at the bar shape.

    python benchmarks/probe_sparse_mla_timeline.py   # H200

B=128 q1 H=16 top-k 2048 (``bench_sparse_mla``'s inputs): 128 programs of the dual kernel, one
per query and SM, each two warpgroup chains of 1024 rows. The question is the one
``probe_msa_decode_fp8_pv.py --trace`` answered for the MSA decode: do programs with equal work
end together, or do some SMs finish early while the launch waits for the slowest ones?

The kernel is not changed: this probe imports a copy of ``decode_gluon_small_h2.py`` with
``%globaltimer`` stamps patched into the dual kernel's two partitions (default: start, its chain
done, the worker's state received, stored; worker: start, its chain done; and the SM), launched
as ``launch_decode`` launches it but with a trace buffer as the partial-output pointer (an
unsplit kernel never writes that pointer). The copy is timed against the module's kernel first,
so that the stamps' cost is known, and its outputs are compared bit for bit.

H200 (session 23, call 9 of ``benchmarks/results/2026-11-30-h200-s23-probes.txt``, before the
store change; copy 4262 GB/s): kernel 52.5 us, stamped copy 52.2, bit-identical. One launch spans
46.0 us from its first program's start: both chains take 37.2-42.2 us (median 39.5; spread ~12%,
against ~45% for the fp8 MSA decode's programs), and the merge and output store after them 2.9-4.8
us (median 3.8), written as 64 two-byte stores per thread at permuted value addresses. Writing 8
consecutive values per 16-byte store instead (``decode_gluon_small_h2._store_halves``) took the
bar shape from 48.5 to 45.6 us in an interleaved A/B, bit-identical.
"""

from __future__ import annotations

import inspect
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_sparse_mla import TOP_K, _bytes, _cache  # noqa: E402
from patched_source import apply_edits, import_source  # noqa: E402

from mate.ops.sparse_mla import decode_gluon_small_h2 as dw  # noqa: E402
from mate.ops.sparse_mla.decode import decode_kernel_args  # noqa: E402
from mate.ops.sparse_mla.metadata import plan_decode  # noqa: E402
from mate.testing.bench import measure_ceilings, rotation_count, time_interleaved  # noqa: E402

B, Q_LEN, H = 128, 1, 16
STAMPS = ("start", "chain done", "worker state in", "stored", "worker start", "worker chain done")

HELPERS = '''

@gluon.jit
def _gtime(dep):
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep.to(gl.int32)], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _gsmid(dep):
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep.to(gl.int32)], dtype=gl.int32,
                                     is_pure=True, pack=1)
'''


def _patched_source() -> str:
    """decode_gluon_small_h2.py with the stamps (see the module docstring)."""
    src = inspect.getsource(dw)
    edits = [
        # helpers after the imports
        ("WG_NUM_WARPS = ", HELPERS.lstrip("\n") + "\n\nWG_NUM_WARPS = "),
        # default partition
        ('''    (log2 domain) and the store."""
    acc0, acc1, m_i, l_i = _wg_chain(''', '''    (log2 domain) and the store."""
    _tr = po_ptr.to(gl.pointer_type(gl.int64)) + bt * 8
    gl.store(_tr + 0, _gtime(bt))
    gl.store(_tr + 6, _gsmid(bt).to(gl.int64))
    acc0, acc1, m_i, l_i = _wg_chain('''),
        ('''                                     PV_FP8)
    mbarrier.wait(done, 0)''', '''                                     PV_FP8)
    gl.store(_tr + 1, _gtime(bt))
    mbarrier.wait(done, 0)
    gl.store(_tr + 2, _gtime(bt))'''),
        ("                  pid_s, num_splits, SPLIT, BLOCK_H, D_V, PV_FP8)\n",
         "                  pid_s, num_splits, SPLIT, BLOCK_H, D_V, PV_FP8)\n    gl.store(_tr + 3, _gtime(bt))\n"),
        # worker partition: the trace pointer passed in, start and chain-done stamps
        ('''def _dual_second(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt,''',
         '''def _dual_second(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, po_ptr, bt,'''),
        ('''    through shared memory (``done`` counts one arrival)."""
    acc0, acc1, m_i, l_i = _wg_chain(''', '''    through shared memory (``done`` counts one arrival)."""
    _tr = po_ptr.to(gl.pointer_type(gl.int64)) + bt * 8
    gl.store(_tr + 4, _gtime(bt))
    acc0, acc1, m_i, l_i = _wg_chain('''),
        ('''    x0.store(acc0)
    x1.store(acc1)''', '''    gl.store(_tr + 5, _gtime(bt))
    x0.store(acc0)
    x1.store(acc1)'''),
        ('''            (_dual_second, (q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt,''',
         '''            (_dual_second, (q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, po_ptr, bt,'''),
    ]
    return apply_edits(src, edits)


def _import_patched():
    return import_source("small_h2_traced", _patched_source())


def _pct(x: torch.Tensor, qs=(0.0, 0.1, 0.5, 0.9, 1.0)) -> str:
    return " / ".join(f"{torch.quantile(x.double(), q).item() / 1e3:.2f}" for q in qs)


def main() -> int:
    traced = _import_patched()
    copy = measure_ceilings()["copy_GBps"]
    kv = _cache(B).view(-1, 576)  # the rows, as sparse_mla_fp8_decode passes them
    tokens = kv.shape[0]
    scale = 1 / math.sqrt(576)
    md = plan_decode(B, Q_LEN, H, TOP_K, "cuda")
    assert md.chains == 2 and md.num_splits == 1, (md.chains, md.num_splits)
    n = rotation_count(B * Q_LEN * TOP_K * 576)  # input sets replayed in turn, as bench_sparse_mla does
    sets = [(torch.randn(B, Q_LEN, H, 576, device="cuda").to(torch.float8_e4m3fn),
             torch.randint(0, tokens, (B, Q_LEN, TOP_K), device="cuda", dtype=torch.int32)) for _ in range(n)]
    sl = torch.full((B,), TOP_K, device="cuda", dtype=torch.int32)
    out = torch.empty(B, Q_LEN, H, 512, device="cuda", dtype=torch.bfloat16)
    out_t = torch.empty_like(out)
    lse = torch.empty(B, Q_LEN, H, device="cuda")
    lse_t = torch.empty_like(lse)
    trace = torch.zeros(B * 8, dtype=torch.int64, device="cuda")

    def plain_launch(q, idx):
        return dw.sparse_mla_decode_gluon_small_h_wg(q, kv, idx, sl, out, lse, md.partial_o, md.partial_lse, scale,
                                                     1.0, md.block_h, md.num_splits, md.split_blocks, md.num_stages,
                                                     chains=md.chains)

    def stamped_launch(q, idx):
        # launch_decode's call of the unsplit kernel, its (unused) partial-output pointer the trace
        args = list(decode_kernel_args(q, kv, idx, sl, out_t, lse_t, md.partial_o, md.partial_lse, scale, 1.0,
                                       md.split_blocks, md.num_splits))
        args[6] = trace.view(torch.float16)
        traced.sparse_mla_decode_small_h_wg_kernel[(md.num_splits, B * Q_LEN)](
            *args, SPLIT=False, HAS_SEQ_LENS=True, D_V=512, D_R=64, num_warps=dw.WG_NUM_WARPS, STAGES=md.num_stages,
            BLOCK_H=md.block_h, BLOCK_N=dw.WG_BLOCK_N, CHAINS=md.chains, PV_FP8=bool(dw.WG_PV_FP8))

    plain = [lambda q=q, idx=idx: plain_launch(q, idx) for q, idx in sets]
    stamped = [lambda q=q, idx=idx: stamped_launch(q, idx) for q, idx in sets]
    plain[0]()
    stamped[0]()
    torch.cuda.synchronize()
    same = torch.equal(out, out_t) and torch.equal(lse, lse_t)
    times = time_interleaved({"kernel": plain, "stamped copy": stamped, "kernel again": plain}, iters=50)
    nbytes = _bytes(B, Q_LEN, H)
    print(f"B={B} q{Q_LEN} H={H} top-k {TOP_K}: copy {copy:.0f} GB/s, {n} input sets; outputs of the stamped "
          f"copy {'bit-identical' if same else 'DIFFER'}")
    for name, t in times.items():
        print(f"  {name:14} {t:6.1f} us  {nbytes / t / 1e3 / copy:6.1%} of copy")
    for run in stamped:
        run()
    torch.cuda.synchronize()
    tr = trace.view(B, 8).clone()
    t0 = tr[:, 0].min()
    ts = {name: tr[:, j] - t0 for j, name in enumerate(STAMPS)}
    span = (tr[:, 3].max() - t0).item() / 1e3
    print(f"one stamped launch: span {span:.2f} us from the first program's start; us, quantiles 0/10/50/90/100 %")
    for name in STAMPS:
        print(f"  {name:18} at {_pct(ts[name])}")
    print(f"  default chain takes {_pct(tr[:, 1] - tr[:, 0])}")
    print(f"  worker chain takes  {_pct(tr[:, 5] - tr[:, 4])}")
    print(f"  merge + store take  {_pct(tr[:, 3] - tr[:, 2])}")
    sm = tr[:, 6]
    per_sm = torch.bincount(torch.bincount(sm)).tolist()
    print(f"  SMs used: {int(sm.unique().numel())} of 132 (count of SMs with 0, 1, 2, ... programs: {per_sm})")
    end = ts["stored"]
    edges = torch.arange(0, end.max().item() + 2000, 2000, device="cuda")
    alive = [int(((ts["start"] <= e) & (end > e)).sum()) for e in edges.tolist()]
    print(f"  every 2 us, programs alive: {alive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
