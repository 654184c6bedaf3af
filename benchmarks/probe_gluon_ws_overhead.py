"""The fixed cost of a Gluon ``warp_specialize`` region and of mbarrier inits on the GPU.

    python benchmarks/probe_gluon_ws_overhead.py

Each of 112 programs TMA-loads one [64, 128] e4m3 block, waits on an mbarrier and stores the
block's sum; the variants differ only in how that is organized (interleaved CUDA-graph
replays over 16 rotated inputs, us per launch; every variant's sums checked first):

* ``plain sN``: one partition issues and waits (``N`` ring barriers initialized, one used);
* ``ws producer sN``: a 1-warp worker partition issues, two 4-warp partitions wait (the
  GEMM kernels' layout, registers 232 / 40 after a 168 launch cap);
* ``ws idle workers``: the default partition issues and waits, the workers do nothing;
* ``ws one worker``: one 1-warp worker issues, the default partition waits.

H200 (2026-11-30): plain s1 1.87 us, s6 2.03, s12 2.19; ws producer s1 2.28, s6 2.42, s12
2.60; ws idle workers 2.29; ws one worker 2.24; other register splits (168 / 168, 64 / 64, no
cap) 2.24-2.27; one partition of 8 or 16 warps 1.89 / 2.09. So a region costs ~0.4 us
whoever issues, and each ring stage's barrier init ~0.026 us: the gap of the warp-specialized
GEMM kernels to DeepGEMM at small M and short K (``groupwise_gluon_flat.py``).
"""

from __future__ import annotations

import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PROGRAMS = 112


@gluon.jit
def _wait_store(a_bufs, ready, out_ptr, STORE: gl.constexpr):
    L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0])
    mbarrier.wait(ready.index(0), 0)
    v = a_bufs.index(0).load(L).to(gl.float32)
    s = gl.sum(gl.sum(v, axis=1), axis=0)
    if STORE:
        gl.store(out_ptr + gl.program_id(0), s)


@gluon.jit
def _issue(a_desc, a_bufs, ready):
    mbarrier.expect(ready.index(0), a_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [gl.program_id(0) * 64, 0], ready.index(0), a_bufs.index(0))


@gluon.jit
def _issue_wait_store(a_desc, a_bufs, ready, out_ptr):
    _issue(a_desc, a_bufs, ready)
    _wait_store(a_bufs, ready, out_ptr, True)


@gluon.jit
def _idle(a_desc, a_bufs, ready):
    pass


@gluon.jit
def probe_kernel(a_desc, out_ptr, STAGES: gl.constexpr, MODE: gl.constexpr, R0: gl.constexpr,
                 R1: gl.constexpr):
    """MODE 0: one partition; 1: producer worker + two waiting partitions; 2: idle workers;
    3: one 1-warp worker issues."""
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 64, 128], a_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()
    if MODE == 0:
        _issue_wait_store(a_desc, a_bufs, ready, out_ptr)
    elif MODE == 1:
        gl.warp_specialize([(_wait_store, (a_bufs, ready, out_ptr, True)),
                            (_wait_store, (a_bufs, ready, out_ptr, False)),
                            (_issue, (a_desc, a_bufs, ready))], [4, 1], [R0, R1])
    elif MODE == 2:
        gl.warp_specialize([(_issue_wait_store, (a_desc, a_bufs, ready, out_ptr)), (_idle, (a_desc, a_bufs, ready)),
                            (_idle, (a_desc, a_bufs, ready))], [4, 1], [R0, R1])
    else:
        gl.warp_specialize([(_wait_store, (a_bufs, ready, out_ptr, True)), (_issue, (a_desc, a_bufs, ready))], [1],
                           [R1])


def _launch(a, out, stages=1, mode=0, regs=(232, 40), maxnreg=168, warps=4):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.float8e4nv)
    desc = TensorDescriptor(a, list(a.shape), [a.shape[-1], 1], [64, 128], layout)
    probe_kernel[(PROGRAMS, )](desc, out, STAGES=stages, MODE=mode, R0=regs[0], R1=regs[1], num_warps=warps,
                               maxnreg=maxnreg if mode else None)


VARIANTS = {
    **{f"plain s{s}": dict(stages=s) for s in (1, 6, 12)},
    **{f"ws producer s{s}": dict(stages=s, mode=1) for s in (1, 6, 12)},
    "ws idle workers": dict(mode=2),
    "ws one worker": dict(mode=3, regs=(40, 40)),
    "ws producer 168/168": dict(mode=1, regs=(168, 168)),
    "ws producer 64/64 cap 64": dict(mode=1, regs=(64, 64), maxnreg=64),
    "ws producer no cap": dict(mode=1, maxnreg=None),
    "plain 8 warps": dict(warps=8),
    "plain 16 warps": dict(warps=16),
}


def main() -> int:
    from mate.testing.bench import time_interleaved

    sets = [torch.randn(PROGRAMS * 64, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(16)]
    out = torch.empty(PROGRAMS, device="cuda")
    ref = sets[0].float().view(PROGRAMS, -1).sum(dim=1)
    cases = {}
    for name, kw in VARIANTS.items():
        out.fill_(float("nan"))
        _launch(sets[0], out, **kw)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-2, msg=name)
        cases[name] = [lambda a=a, kw=kw: _launch(a, out, **kw) for a in sets]
    for name, t in time_interleaved(cases, rounds=5, iters=400).items():
        print(f"{name:>26} " + (f"{t:7.2f} us" if isinstance(t, float) else str(t)[:200]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
