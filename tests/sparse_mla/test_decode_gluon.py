"""Tests of the experimental Gluon decode kernel (``plan_decode(..., gluon=True)``).

Gluon cannot run under Triton's interpreter, so on the CPU these tests only check that the
kernel module imports and that the plan option is validated and falls back to the plain
kernel (whose results are then checked against the reference). The kernel itself is checked
against ``sparse_mla_decode_reference`` by the ``gpu`` tests (H200, through
``benchmarks/run_gpu.py``), with the GPU tolerances of ``test_decode.py`` (the same FP8
tensor-core accumulation of Q·Kᵀ and fp16 P·V as the plain 64-head kernel).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from mate.ops.sparse_mla.metadata import (
    GLUON_MIN_SPLIT_BLOCKS,
    GLUON_SMALL_H_STAGES,
    GLUON_STAGES,
    GLUON_WG_STAGES,
    plan_decode,
)
from mate.testing import assert_equal, poisoned
from tests._markers import interpreter_only
from tests.sparse_mla.test_decode import _call, _check, _make, check_graph_replay, count_unequal_repeats


def test_gluon_module_imports():
    from mate.ops.sparse_mla import decode_gluon

    assert callable(decode_gluon.sparse_mla_decode_gluon)
    assert decode_gluon.GLUON_BLOCK_H == 64 and decode_gluon.GLUON_NUM_WARPS == 8


@pytest.mark.parametrize("num_splits", [1, 2, 4, 8, 16])
def test_split_plans_pick_the_kernel_by_split_length(monkeypatch, num_splits):
    """H > 32 on Hopper (faked here): the Gluon kernel without a split or with splits of at
    least GLUON_MIN_SPLIT_BLOCKS 64-key blocks, the plain kernel with prefetched indices on
    shorter splits."""
    from mate.ops.sparse_mla import metadata

    monkeypatch.setattr(metadata, "_is_hopper", lambda device: True)
    monkeypatch.setattr(metadata, "_check_gluon", lambda *args, **kw: True)
    md = plan_decode(8, 1, 128, 2048, "cpu", num_sms=132, num_splits=num_splits)
    assert md.num_splits == num_splits and md.split_blocks == 32 // num_splits
    gluon = num_splits == 1 or md.split_blocks >= GLUON_MIN_SPLIT_BLOCKS
    assert md.gluon == gluon and md.prefetch_idx == (not gluon)
    assert md.num_stages == (GLUON_STAGES if gluon else 4)


@interpreter_only
def test_gluon_plan_falls_back_on_cpu(triton_backend):
    """On a device that is not a GPU the option plans the plain 64-head kernel, which runs
    (under the interpreter on a CPU-only machine)."""
    device = "cpu"
    B, q_len, H, top_k = 2, 1, 40, 64  # 40 heads: one padded 64-head program per row
    md = plan_decode(B, q_len, H, top_k, device, gluon=True)
    assert md.gluon is False and md.block_h == 64 and md.num_splits == 1
    q, kv, idx, sl = _make(B, q_len, H, top_k, device=device)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, device)
    lse = poisoned((B, q_len, H), torch.float32, device)
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=0.05, bmm2_scale=1.5, metadata=md)
    _check(out, lse, q, kv, idx, sl, 0.05, 1.5)


@pytest.mark.parametrize("H,kw,match", [
    (16, {}, "block_h"),  # 16 heads plan 16-head programs
    (128, dict(block_h=32), "block_h"),
    (128, dict(block_n=16), "block_n"),
    (128, dict(num_warps=4), "num_warps"),
    (128, dict(max_regs=128), "max_regs"),
    (128, dict(prefetch_idx=True), "prefetch_idx"),
    (128, dict(num_stages=4), "num_stages"),
])
def test_gluon_plan_rejects_other_configurations(H, kw, match):
    with pytest.raises(ValueError, match=match):
        plan_decode(2, 1, H, 2048, "cpu", gluon=True, **kw)


def test_gluon_plan_defaults_off():
    assert plan_decode(2, 1, 128, 2048, "cpu").gluon is False
    md = plan_decode(2, 1, 16, 2048, "cpu", gluon=True, block_h=64)  # padded heads are allowed
    assert md.block_h == 64 and md.gluon is False


@interpreter_only
@pytest.mark.parametrize("H,small_h", [(16, True), (40, False)])
def test_gluon_launchers_unaligned_cache_and_split_on_cpu(triton_backend, H, small_h):
    """The launchers' Python path (``gluon_common.launch_decode``) runs under the
    interpreter when the cache view is not 16-byte aligned: the plain-kernel fallback with
    the launcher's configuration, a split plan's scratch and combine."""
    from mate.ops.sparse_mla.decode_gluon import sparse_mla_decode_gluon
    from mate.ops.sparse_mla.decode_gluon_small_h import sparse_mla_decode_gluon_small_h

    B, q_len, top_k = 2, 1, 128
    q, kv, idx, sl = _make(B, q_len, H, top_k, device="cpu")
    kv8 = torch.empty(kv.numel() + 8, dtype=torch.uint8)[8:].view(torch.float8_e4m3fn).view(kv.shape)
    kv8.copy_(kv)
    md = plan_decode(B, q_len, H, top_k, "cpu", transposed=small_h, block_h=16 if small_h else 64, num_splits=2)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cpu")
    lse = poisoned((B, q_len, H), torch.float32, "cpu")
    args = (q, kv8.view(-1, 576), idx, sl, out, lse, md.partial_o, md.partial_lse, 0.05, 1.5)
    if small_h:
        sparse_mla_decode_gluon_small_h(*args, md.block_h, md.num_splits, md.split_blocks, 5)
    else:
        sparse_mla_decode_gluon(*args, md.num_splits, md.split_blocks)
    _check(out, lse, q, kv, idx, sl, 0.05, 1.5)


# ------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu
S1 = 1 / math.sqrt(576)


def require_self_check(module):
    """The kernel module's self-check in a child process first: a kernel that faulted in
    this process would poison the CUDA context of every later GPU test."""
    reason = importlib.import_module(module).probe_in_subprocess()
    if reason is not None:
        pytest.fail(reason)


@pytest.fixture(scope="module")
def gluon_ok():
    require_self_check("mate.ops.sparse_mla.decode_gluon")


def _gluon_plan(B, q_len, H, top_k, **kw):
    md = plan_decode(B, q_len, H, top_k, "cuda", gluon=True, **kw)
    assert md.gluon and md.block_h == 64 and md.num_warps == 8
    return md


def _run(q, kv, idx, sl, top_k, md, s2=1.25):
    B, q_len, H = q.shape[:3]
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=S1, bmm2_scale=s2, metadata=md)
    return out, lse


@gpu
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("B,q_len,top_k", [(1, 1, 2112), (8, 2, 2048), (64, 1, 2048), (3, 2, 2112), (1, 2, 2048)])
def test_gpu_gluon_decode_matches_reference(gluon_ok, H, B, q_len, top_k):
    """Invalid slots (-1, out of range, INT_MIN), duplicates, partial seq_lens, an empty
    batch element (B > 2), and the plan's split (B = 1, 3, 8) or no split (B = 64)."""
    check_decode(_gluon_plan, B, q_len, H, top_k, four_d=B == 3)


@gpu
@pytest.mark.parametrize("kw", [dict(num_splits=1), dict(num_splits=5), dict(num_stages=2),
                                dict(partial_dtype=torch.float32), dict(seq_lens=None)])
def test_gpu_gluon_plan_variants(gluon_ok, kw):
    check_decode(_gluon_plan, 4, 2, 128, 2048, **kw)


def check_decode(plan, B, q_len, H, top_k, four_d=False, **kw):
    """A decode planned by ``plan(B, q_len, H, top_k, **kw)`` against the reference; ``kw``
    ``seq_lens=None`` decodes without seq_lens (else partial ones)."""
    seq_lens = "none" if kw.pop("seq_lens", "partial") is None else "partial"
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, four_d=four_d, device="cuda",
                           seq_lens=seq_lens)
    out, lse = _run(q, kv, idx, sl, top_k, plan(B, q_len, H, top_k, **kw))
    _check(out, lse, q, kv, idx, sl, S1, 1.25)


def check_empty_rows_and_all_invalid(plan, H, splits):
    """seq_lens 0, a query whose slots are all invalid, and splits whose slots all are:
    out 0 and lse +inf for empty rows, no NaN anywhere. ``plan(B, q_len, H, top_k, **kw)``."""
    B, q_len, top_k = 4, 1, 2048
    q, kv, idx, _ = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    sl = torch.tensor([top_k, 0, top_k, 100], dtype=torch.int32, device="cuda")
    idx[2] = -1  # every slot invalid
    idx[0, :, 64:1024] = -1  # whole blocks invalid inside a valid row
    md = plan(B, q_len, H, top_k, num_splits=splits)
    out, lse = _run(q, kv, idx, sl, top_k, md)
    _check(out, lse, q, kv, idx, sl, S1, 1.25)
    assert_equal(out[1:3], torch.zeros_like(out[1:3]))
    assert_equal(lse[1:3], torch.full_like(lse[1:3], float("inf")))


def check_unaligned_cache(plan, H):
    """A cache view whose base is not 16-byte aligned (cp.async needs it) still decodes (the
    launcher takes the plain kernel)."""
    B, q_len, top_k = 2, 1, 2048
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    storage = torch.empty(kv.numel() + 8, dtype=torch.uint8, device="cuda")
    kv8 = storage[8:].view(torch.float8_e4m3fn).view(kv.shape)
    kv8.copy_(kv)
    assert kv8.data_ptr() % 16 == 8
    md = plan(B, q_len, H, top_k)
    out, lse = _run(q, kv8, idx, sl, top_k, md)
    _check(out, lse, q, kv, idx, sl, S1, 1.25)


@gpu
def test_gpu_gluon_empty_rows_and_all_invalid(gluon_ok):
    check_empty_rows_and_all_invalid(_gluon_plan, 128, 4)


@gpu
def test_gpu_gluon_unaligned_cache_takes_plain_kernel(gluon_ok):
    check_unaligned_cache(_gluon_plan, 64)


@gpu
def test_gpu_plain_transposed_plan_on_unaligned_cache():
    """The plain small-H (transposed) plan on a cache view that is not 16-byte aligned: the
    launcher runs the heads-on-M kernel instead (the transposed one faulted there)."""
    check_unaligned_cache(lambda B, q_len, H, top_k, **kw: plan_decode(B, q_len, H, top_k, "cuda", gluon=False,
                                                                       transposed=True, **kw), 16)


@gpu
def test_gpu_gluon_cuda_graph_replay_and_no_allocation(gluon_ok):
    md = _gluon_plan(4, 2, 128, 2048)
    assert md.num_splits > 1
    check_graph_replay(4, 2, 128, 2048, md)


@gpu
def test_gpu_gluon_repeated_decodes_bit_identical(gluon_ok):
    md = _gluon_plan(8, 1, 128, 2048)
    assert md.num_stages == GLUON_STAGES
    assert count_unequal_repeats(8, 1, 128, 2048, md, 200) == 0


@gpu
# split plans whose decode grid is small enough for the PDL combine: the 64-head kernel, the
# one-warpgroup small-H kernel and the 8-warp one
@pytest.mark.parametrize("B,q_len,H", [(1, 1, 128), (2, 2, 64), (1, 1, 16), (1, 2, 32), (2, 1, 32), (4, 1, 16)])
def test_gpu_pdl_combine_bit_identical_and_graph_safe(gluon_ok, B, q_len, H):
    """A split plan with a small decode grid launches its combine as a programmatic dependent
    (the decode signals at its start, the combine waits before its first load): the outputs
    are bit for bit those of the same plan with ``pdl=False``, match the reference, and the
    launch pair is captured and replayed in a CUDA graph."""
    top_k = 2048
    md = plan_decode(B, q_len, H, top_k, "cuda")
    assert md.gluon and md.num_splits > 1 and md.pdl, md
    plain = plan_decode(B, q_len, H, top_k, "cuda", pdl=False)
    assert not plain.pdl and (plain.num_splits, plain.split_blocks, plain.chains) == (md.num_splits, md.split_blocks,
                                                                                      md.chains)
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    out, lse = _run(q, kv, idx, sl, top_k, md)
    _check(out, lse, q, kv, idx, sl, S1, 1.25)
    plain_out, plain_lse = _run(q, kv, idx, sl, top_k, plain)
    assert_equal(out, plain_out)
    assert_equal(lse, plain_lse)
    check_graph_replay(B, q_len, H, top_k, md)


@gpu
@pytest.mark.parametrize("B,q_len,H,splits,pdl", [(1, 1, 128, 16, True), (1, 2, 128, 16, True), (2, 1, 64, 16, True),
                                                  (4, 1, 128, 16, False), (8, 1, 128, 8, False),
                                                  (32, 1, 128, 2, False), (1, 1, 16, 16, True), (4, 1, 16, 16, True),
                                                  (2, 1, 32, 16, True), (16, 1, 16, 8, False)])
def test_gpu_small_batch_split_plans(gluon_ok, B, q_len, H, splits, pdl):
    """Gluon plans split the top-k list down to GLUON_MIN_SPLIT_BLOCKS (2) blocks while that
    needs at most one program per SM of the H200's 132, and launch the combine as a
    programmatic dependent when the grid has at most half as many programs as SMs."""
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("split counts are those of a 132-SM GPU (the H200 they were measured on)")
    md = plan_decode(B, q_len, H, 2048, "cuda")
    assert md.gluon and (md.num_splits, md.split_blocks, md.pdl) == (splits, 32 // splits, pdl), md


def test_pdl_combine_rule(monkeypatch):
    """A split Gluon plan launches its combine as a programmatic dependent when the decode grid
    has at most PDL_MAX_GRID_FRACTION of the SMs in programs; 0 turns it off. Off the GPU no
    plan asks for it, and ``pdl=True`` needs a split Gluon plan."""
    from mate.ops.sparse_mla import metadata

    assert metadata.PDL_MAX_GRID_FRACTION == 0.5
    assert [metadata.pdl_combine(n, 132) for n in (1, 16, 66, 67, 128, 1024)] == [True] * 3 + [False] * 3
    assert not plan_decode(1, 1, 128, 2048, "cpu").pdl
    with pytest.raises(ValueError, match="pdl=True needs a split Gluon plan"):
        plan_decode(1, 1, 128, 2048, "cpu", pdl=True)
    monkeypatch.setattr(metadata, "PDL_MAX_GRID_FRACTION", 0.0)
    assert not metadata.pdl_combine(1, 132)


@gpu
@pytest.mark.parametrize("B,q_len,H,want", [(64, 1, 128, "gluon"), (128, 2, 128, "gluon"),
                                            (128, 1, 16, "small_h dual"), (128, 1, 32, "small_h"),
                                            (64, 1, 16, "small_h dual split"),
                                            (8, 1, 128, "gluon split"), (1, 1, 128, "gluon split"),
                                            (32, 2, 16, "small_h dual split"),
                                            (1, 1, 16, "small_h split"),
                                            (32, 1, 128, "gluon split"), (8, 2, 128, "gluon split"),
                                            (32, 2, 64, "gluon split")])
def test_gpu_default_plans(gluon_ok, B, q_len, H, want):
    """Hopper defaults: H > 32 runs the 64-head Gluon kernel without a split or with splits of
    at least GLUON_MIN_SPLIT_BLOCKS blocks (every split of a top-k 2048 plan; shorter splits run
    the plain kernels with prefetched indices, see test_split_plans_pick_the_kernel_by_split_length);
    H <= 32 the small-H Gluon kernel (H <= 16: its one-warpgroup variant, as the
    dual kernel, two chains per program, where the plan has at least as many chains as SMs: B=128
    q1 then needs no split). A split plan whose decode grid fills at most half the SMs launches
    its combine as a programmatic dependent (B=1 here)."""
    md = plan_decode(B, q_len, H, 2048, "cuda")
    if want.startswith("gluon"):
        assert md.gluon and md.block_h == 64 and (md.num_splits > 1) == want.endswith("split")
        assert md.num_stages == GLUON_STAGES and not md.prefetch_idx
        assert md.num_splits == 1 or md.split_blocks >= GLUON_MIN_SPLIT_BLOCKS
    elif want.startswith("small_h"):
        assert md.gluon and md.transposed and md.block_h == max(16, H)
        assert (md.num_warps, md.num_stages) == ((4, GLUON_WG_STAGES) if H <= 16 else (8, GLUON_SMALL_H_STAGES))
        assert (md.num_splits > 1) == want.endswith("split")
        assert md.chains == (2 if "dual" in want else 1)
    else:
        raise AssertionError(f"unknown expectation {want!r}")
    programs = md.num_head_tiles * md.num_splits * B * q_len
    assert md.pdl == (md.num_splits > 1 and 2 * programs <= torch.cuda.get_device_properties(0).multi_processor_count)


_SM90_BUILD_64 = """
import json, os, sys
import mate
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(mate.__file__)), "benchmarks"))
from compile_sparse_mla_gluon import compile_decode
from mate.ops.sparse_mla import decode_gluon as dg
from mate.ops.sparse_mla.metadata import GLUON_STAGES
for split, pdl in ((False, False), (True, False), (True, True)):
    cx = {"SPLIT": split, "HAS_SEQ_LENS": True, "STAGES": GLUON_STAGES, "BLOCK_H": dg.GLUON_BLOCK_H,
          "BLOCK_N": dg.GLUON_BLOCK_N}
    rep = compile_decode(dg.sparse_mla_decode_gluon_kernel, split, cx, dg.GLUON_NUM_WARPS, None, "g", None,
                         after={"PDL": pdl}, ptxas=True)
    print(json.dumps(dict(split=split, pdl=pdl, regs=rep.registers, spills=rep.spills, shared=rep.shared,
                          qgmma=rep.sass.count("QGMMA"), hgmma=rep.sass.count("HGMMA"),
                          stg128=rep.sass.count("STG.E.128"), stg32=rep.sass.count("STG.E "),
                          signal=rep.kernel.asm["ptx"].count("griddepcontrol.launch_dependents"),
                          serialized=[w for w in rep.ptxas_warnings if "serialized" in w])))
"""


def test_gluon_sm90_build():
    """The 64-head kernel compiles for sm_90 on the CPU (a child process without the
    interpreter) at the default stages, with and without a split: QGMMA Q·Kᵀ and HGMMA P·V, no
    spills, no wgmma serialization, within an SM's shared memory, and the output tile written
    with 16-byte stores (8 consecutive values per thread; only the LSE, 2 per thread, in 4-byte
    ones)."""
    from mate.testing.sass import SMEM_LIMIT
    from tests._sm90 import sm90_build_reports

    reps = sm90_build_reports(_SM90_BUILD_64)
    assert [(r["split"], r["pdl"]) for r in reps] == [(False, False), (True, False), (True, True)]
    for rep in reps:
        assert rep["spills"] == 0 and not rep["serialized"] and rep["shared"] <= SMEM_LIMIT, rep
        assert rep["qgmma"] > 0 and rep["hgmma"] > 0, rep
        assert rep["stg128"] == 16 and rep["stg32"] == 2, rep
        assert rep["signal"] == int(rep["pdl"]), rep  # the PDL build signals its dependents once


_SM90_BUILD_COMBINE = """
import json
from triton.compiler import ASTSource
from mate.ops.sparse_mla.decode import sparse_mla_decode_combine_kernel
from mate.testing.sass import compile_sm90, divisibility_attrs
sig = {"po_ptr": "*fp16", "plse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "out_scale": "fp32", "H": "i32"}
for pdl in (False, True):
    cx = {"NUM_SPLITS": 8, "SPLITS_P2": 8, "BLOCK_HC": 16, "BLOCK_D": 128, "D_V": 512, "PDL": pdl}
    s = {**sig, **{k: "constexpr" for k in cx}}
    rep = compile_sm90(ASTSource(fn=sparse_mla_decode_combine_kernel, signature=s, constexprs=cx,
                                 attrs=divisibility_attrs(s, ("po_ptr", "plse_ptr", "out_ptr", "lse_ptr"))),
                       {"num_warps": 4, "launch_pdl": pdl})
    ptx = rep.kernel.asm["ptx"]
    print(json.dumps(dict(pdl=pdl, regs=rep.registers, spills=rep.spills, wait=ptx.count("griddepcontrol.wait"),
                          wait_first=-1 < ptx.find("griddepcontrol.wait") < ptx.find("ld.global"))))
"""


def test_combine_pdl_sm90_build():
    """The split combine compiles for sm_90 with and without PDL; the PDL build waits for the
    decode (``griddepcontrol.wait``) once, before its loads, and the plain one never."""
    from tests._sm90 import sm90_build_reports

    reps = sm90_build_reports(_SM90_BUILD_COMBINE)
    assert [(r["pdl"], r["wait"], r["spills"]) for r in reps] == [(False, 0, 0), (True, 1, 0)], reps
    assert reps[1]["wait_first"], reps  # the wait precedes every global load
