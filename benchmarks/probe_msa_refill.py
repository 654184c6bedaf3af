"""Probe: does refilling a TMA ring slot as soon as it is read hide a per-tile pause?

``probe_msa_decode_floor.py --set delay`` found that a pause per tile (``nanosleep``, no SM work)
slows the decode's load floor by about what the decode's compute costs it: Triton's pipeliner
issues a tile's loads at the end of the iteration two tiles earlier, so a long per-tile chain
leaves one tile in flight while it runs. This Gluon load floor reads the same bytes (the MSA
fp8 decode bar's selected K / V tiles, one program per token and KV head, 64-key TMA boxes,
each consumed by two small QGMMAs) with a ring of ``STAGES`` slots, all filled in the prologue,
and refills a slot with the tile ``STAGES`` ahead either right after its QGMMAs are waited
(``EARLY``) or after the pause (late), against the Triton floor of the same grid.

    python benchmarks/probe_msa_refill.py            # H200
    python benchmarks/probe_msa_refill.py --compile  # CPU: sm_90 registers / shared memory / SASS counts

H200 (session 31, call 8 of ``benchmarks/results/2026-12-01-h200-s31-probes.txt``; 8 calls per
replay, two processes, us): token-major Triton floor 68.5 / 69.2, with a 1 us pause per tile 72.2
/ 72.3; Gluon early refill 67.4 / 67.6, with the pause 71.8 / 72.5 (0.5 us: 69.3 / 70.0); late
refill 67.3 / 67.7, with the pause 71.4 / 72.2. Head-major: Triton 65.9 / 65.3 -> 70.3 / 69.3,
Gluon early 64.7 / 64.6 -> 72.0 / 71.9, late 64.7 / 64.6 -> 70.2 / 69.6, early with 2 stages and
the pause 69.1 / 69.7. Three tiles always in flight do not absorb the pause: what it costs is
not the load pipeline's depth.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from probe_msa_decode_floor import _delay  # noqa: E402  (DELAY 1 / 2: ~0.5 / ~1 us of nanosleep)
from probe_msa_decode_fp8_pv import _issue_tile  # noqa: E402

HEAD_DIM = gl.constexpr(128)
GP = gl.constexpr(16)


@gluon.jit
def _issue(k_desc, v_desc, k_ring, v_ring, ready, slot, pg_row, tile, h, HKV: gl.constexpr, KEYS: gl.constexpr,
           HEAD_MAJOR: gl.constexpr):
    """``probe_msa_decode_fp8_pv._issue_tile`` of tile ``tile`` of this program's pages ``pg_row``."""
    KPB: gl.constexpr = 128 // KEYS
    page = gl.load(pg_row + tile // KPB)
    _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page, tile, h, HKV, KEYS, KPB, HEAD_MAJOR)


@gluon.jit
def refill_floor_kernel(k_desc, v_desc, pg_ptr, q_ptr, sink_ptr, HKV: gl.constexpr, SEL: gl.constexpr,
                        KEYS: gl.constexpr, STAGES: gl.constexpr, HEAD_MAJOR: gl.constexpr, EARLY: gl.constexpr,
                        SLEEP: gl.constexpr):
    """One program per (token, KV head): its SEL blocks' K / V tiles through a STAGES-slot TMA
    ring, each consumed by K·Qᵀ and V·Qᵀ QGMMAs [KEYS, 16]; then a pause (``SLEEP``)."""
    p = gl.program_id(0)
    h = p % HKV
    pg_row = pg_ptr + p * SEL
    KPB: gl.constexpr = 128 // KEYS
    n_tiles: gl.constexpr = SEL * KPB
    Q_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    offs_h = gl.arange(0, GP, layout=gl.SliceLayout(1, Q_L))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, Q_L))
    q = gl.load(q_ptr + offs_d[None, :] + 0 * offs_h[:, None])
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [GP, HEAD_DIM], Q_SL, q)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    fence_async_shared()
    gl.thread_barrier()
    for j in gl.static_range(STAGES):
        _issue(k_desc, v_desc, k_ring, v_ring, ready, j, pg_row, j, h, HKV, KEYS, HEAD_MAJOR)
    q_t = q_smem.permute((1, 0))
    acc = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    for i in range(n_tiles):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = warpgroup_mma(k_ring.index(slot), q_t, acc, is_async=True)
        acc = warpgroup_mma(v_ring.index(slot), q_t, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if EARLY:
            gl.thread_barrier()  # every warp's QGMMAs are done with this slot
            if i + STAGES < n_tiles:
                _issue(k_desc, v_desc, k_ring, v_ring, ready, slot, pg_row, i + STAGES, h, HKV, KEYS, HEAD_MAJOR)
        if SLEEP != 0:
            acc = _delay(acc, SLEEP)
        if not EARLY:
            gl.thread_barrier()
            if i + STAGES < n_tiles:
                _issue(k_desc, v_desc, k_ring, v_ring, ready, slot, pg_row, i + STAGES, h, HKV, KEYS, HEAD_MAJOR)
    gl.store(sink_ptr + p, gl.sum(gl.sum(acc, axis=1), axis=0).to(gl.int32))


def _descs(k2d: torch.Tensor, v2d: torch.Tensor, keys: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    return [TensorDescriptor(x, list(x.shape), list(x.stride()), [keys, HEAD_DIM.value], sl) for x in (k2d, v2d)]


def compile_report() -> None:
    from triton.experimental.gluon._runtime import GluonASTSource

    from mate.testing.sass import compile_sm90, opcode_counts

    sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    desc = f"tensordesc<fp8e4nv[64, 128],{sl}>"
    for early in (True, False):
        ce = dict(HKV=4, SEL=16, KEYS=64, STAGES=3, HEAD_MAJOR=False, EARLY=early, SLEEP=2)
        sig = {"k_desc": desc, "v_desc": desc, "pg_ptr": "*i32", "q_ptr": "*fp8e4nv", "sink_ptr": "*i32"}
        sig.update({n: "constexpr" for n in ce})
        src = GluonASTSource(fn=refill_floor_kernel, signature=sig, constexprs=ce)
        rep = compile_sm90(src, {"num_warps": 4}, ptxas=True, keep_text=True, tag=f"refill_{int(early)}")
        ops = opcode_counts(rep.sass)
        print(f"EARLY={early}: {rep.registers} registers, {rep.spills} spills, {rep.shared} B shared, "
              + str({o: n for o, n in sorted(ops.items()) if any(k in o for k in ("GMMA", "UTMALDG", "BAR", "SLEEP"))}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if args.compile:
        compile_report()
        return
    import probe_msa_decode_floor as pf
    from bench_msa_attention import BLK, HKV, D, decode_inputs
    from bench_msa_fp8_decode_variants import copy_gbps

    from mate.testing.bench import bandwidth_lines, time_interleaved

    sel = 16
    rate = copy_gbps()
    pb = decode_inputs(128, 65536, torch.float8_e4m3fn, sel)
    k, v, idx, table = pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    B = table.shape[0]
    pg = torch.gather(table, 1, idx.view(B, -1).long()).view(B, HKV, sel).to(torch.int32).contiguous()
    k_hnd, v_hnd = (x.permute(0, 2, 1, 3).contiguous() for x in (k, v))
    q8 = torch.full((D,), 0.5, device="cuda").to(k.dtype)
    sink = torch.empty(B * HKV, dtype=torch.int32, device="cuda")
    nbytes = 2.0 * B * HKV * sel * BLK * D
    descs = {"NHD": _descs(k.view(-1, HKV * D), v.view(-1, HKV * D), 64),
             "HND": _descs(k_hnd.view(-1, D), v_hnd.view(-1, D), 64)}

    def gluon_case(lay, early, sleep, stages=3):
        kd, vd = descs[lay]

        def fn():
            refill_floor_kernel[(B * HKV,)](kd, vd, pg, q8, sink, HKV, sel, 64, stages, lay == "HND", early, sleep,
                                            num_warps=4)
        return [fn] * 8

    def triton_case(lay, sleep):
        kk, vv = (k_hnd, v_hnd) if lay == "HND" else (k, v)
        swap = pf._Swap(MODE=2, DELAY=sleep) if sleep else pf._Swap(MODE=2)
        from mate.ops.msa import sparse_decode as sd
        from mate.ops.msa.sparse_attention import sparse_attention

        out = torch.empty(B, 64, D, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(B, 64, device="cuda")

        def fn():
            keep = sd.msa_decode_t_kernel
            sd.msa_decode_t_kernel = swap
            try:
                sparse_attention(pb["q"], kk, vv, kv_block_indexes=idx, page_table=table, qo_indptr=pb["qo_indptr"],
                                 kv_lens=pb["kv_lens"], out=out, lse=lse, causal=True, decode=True, num_kv_splits=1,
                                 num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = keep
        return [fn] * 8

    cases = {}
    for lay in ("NHD", "HND"):
        cases[f"{lay} Triton floor"] = triton_case(lay, 0)
        cases[f"{lay} Triton floor, sleep 1 us"] = triton_case(lay, 2)
        for early, name in ((True, "early"), (False, "late")):
            cases[f"{lay} Gluon {name} refill"] = gluon_case(lay, early, 0)
            cases[f"{lay} Gluon {name} refill, sleep 0.5 us"] = gluon_case(lay, early, 1)
            cases[f"{lay} Gluon {name} refill, sleep 1 us"] = gluon_case(lay, early, 2)
        cases[f"{lay} Gluon early refill, 2 stages, sleep 1 us"] = gluon_case(lay, True, 2, stages=2)
    for fns in cases.values():
        fns[0]()
    torch.cuda.synchronize()
    times = time_interleaved(cases, rounds=5, iters=50)
    print(f"--- fp8 selected K/V {nbytes / 1e6:.1f} MB; copy {rate:.0f} GB/s; 8 calls per replay")
    print("\n".join(bandwidth_lines(times, nbytes, rate, 44)))


if __name__ == "__main__":
    main()
