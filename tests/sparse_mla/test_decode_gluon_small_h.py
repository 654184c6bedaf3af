"""Tests of the small-H Gluon decode kernel (``plan_decode(..., gluon=True, transposed=True)``).

Gluon cannot run under Triton's interpreter: on the CPU these tests check that the module
imports, that the plan option is validated and falls back to the plain transposed kernel
(checked against the reference). The kernel itself is checked against
``sparse_mla_decode_reference`` by the ``gpu`` tests, with the GPU tolerances of
``test_decode.py`` (FP8 tensor-core accumulation of Sᵀ; P·V in fp16, or in FP8 with P as hi +
lo e4m3 tiles, the one-warpgroup kernel's default). An sm_90 build test runs on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.sparse_mla.metadata import GLUON_SMALL_H_STAGES, GLUON_WG_STAGES, plan_decode
from mate.ops.sparse_mla.reference import sparse_mla_decode_reference
from mate.testing import assert_close, assert_equal, poisoned
from tests._markers import interpreter_only
from tests.sparse_mla.test_decode import (
    GPU_OUT_TOL,
    _call,
    _check,
    _make,
    check_graph_replay,
    count_unequal_repeats,
)
from tests.sparse_mla.test_decode_gluon import (
    S1,
    check_decode,
    check_empty_rows_and_all_invalid,
    check_unaligned_cache,
    require_self_check,
)


def test_small_h_module_imports():
    from mate.ops.sparse_mla import decode_gluon_small_h as m

    assert callable(m.sparse_mla_decode_gluon_small_h)
    assert m.SMALL_H_NUM_WARPS == 8 and m.SMALL_H_BLOCK_N == 64


def test_small_h_perm_values_is_the_renaming_of_load_vt():
    """Row m of Oᵀ holds value _perm_values(m, 512): the reshape + permute of ``_vt_operand`` on
    indices (the 8-warp kernel's 512 value rows)."""
    d = torch.arange(512)
    renamed = d.view(8, 8, 4, 2).permute(2, 0, 3, 1).reshape(512)  # [D876, D543, D21, d0] -> m order
    from mate.ops.sparse_mla.decode_gluon_small_h import _perm_values

    assert_equal(renamed, _perm_values(torch.arange(512), 512))


_WG_SM90_BUILD = """
import json, os, sys
import mate
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(mate.__file__)), "benchmarks"))
from compile_sparse_mla_gluon import compile_decode  # the decode kernels' sm_90 build (signature, aligned pointers)
from mate.ops.sparse_mla import decode_gluon_small_h as dg, decode_gluon_small_h2 as dw

def report(rep, **key):
    print(json.dumps(dict(**key, regs=rep.registers, spills=rep.spills, shared=rep.shared,
                          qgmma=rep.sass.count("QGMMA"), hgmma=rep.sass.count("HGMMA"),
                          stg128=rep.sass.count("STG.E.128"), stg16=rep.sass.count("STG.E.U16"),
                          signal=rep.kernel.asm["ptx"].count("griddepcontrol.launch_dependents"),
                          serialized=[w for w in rep.ptxas_warnings if "serialized" in w])))

for chains in (1, 2):  # the one-warpgroup kernel's split build also signals a PDL combine
    cx = {"SPLIT": True, "HAS_SEQ_LENS": True, "STAGES": 2, "BLOCK_H": 16, "BLOCK_N": dw.WG_BLOCK_N}
    report(compile_decode(dw.sparse_mla_decode_small_h_wg_kernel, True, cx, dw.WG_NUM_WARPS, None, "wg", None,
                          after={"CHAINS": chains, "PV_FP8": dw.WG_PV_FP8, "PDL": chains == 1}, ptxas=True),
           chains=chains, pdl=chains == 1)
for block_h, stages in ((16, 2), (32, 3)):  # the 8-warp kernel's FP8 P·V
    cx = {"SPLIT": True, "HAS_SEQ_LENS": True, "STAGES": stages, "V_EARLY": False, "BLOCK_H": block_h,
          "BLOCK_N": dg.SMALL_H_BLOCK_N}
    report(compile_decode(dg.sparse_mla_decode_small_h_kernel, True, cx, dg.SMALL_H_NUM_WARPS, None, "8w", None,
                          after={"PV_FP8": True, "PDL": block_h == 32}, ptxas=True), chains=0, block_h=block_h,
           pdl=block_h == 32)
"""


def test_small_h_fp8_pv_sm90_build():
    """The one-warpgroup kernel and its dual kernel compile for sm_90 on the CPU (a child process
    without the interpreter) with the default FP8 P·V: no spills, no wgmma serialization (reading
    an accumulator between a wgmma and its wait made ptxas serialize every wgmma of the dual
    kernel), no HGMMA, 2 programs per SM (<= 113 KB shared memory; the dual kernel <= 227 KB),
    the output written with 16-byte stores.
    So does the 8-warp kernel's FP8 P·V (16 heads at 2 stages: <= 128 registers, 2 programs
    per SM), its output also in 16-byte stores. The PDL builds (a split plan with a small grid)
    execute ``griddepcontrol.launch_dependents`` once, the others never."""
    from mate.ops.sparse_mla.decode_gluon_small_h2 import WG_PV_FP8, WG_SMEM_LIMIT
    from mate.testing.sass import SMEM_LIMIT
    from tests._sm90 import sm90_build_reports

    assert WG_PV_FP8
    reps = sm90_build_reports(_WG_SM90_BUILD)
    assert [r["chains"] for r in reps] == [1, 2, 0, 0]
    for rep in reps:
        limit = WG_SMEM_LIMIT if rep["chains"] == 1 or rep.get("block_h") == 16 else SMEM_LIMIT
        assert rep["spills"] == 0 and not rep["serialized"] and rep["hgmma"] == 0, rep
        assert rep["qgmma"] > 0 and rep["shared"] <= limit, rep
    assert reps[0]["regs"] <= 232, reps[0]  # 203 at this change (255 with the fp16 P·V)
    assert reps[2]["regs"] <= 128, reps[2]  # 128 (200 with the fp16 P·V)
    for rep in reps:  # the output in 16-byte stores of 8 consecutive values (natural_layout)
        assert rep["stg128"] > 0 and rep["stg16"] == 0, rep
        assert rep["signal"] == int(rep["pdl"]), rep  # a PDL build signals its dependents once


@interpreter_only
@pytest.mark.parametrize("H,q_len", [(16, 2), (20, 1)])
def test_small_h_plan_falls_back_on_cpu(triton_backend, H, q_len):
    """On a device that is not a GPU the option plans the plain transposed kernel."""
    B, top_k = 3, 128
    md = plan_decode(B, q_len, H, top_k, "cpu", gluon=True, transposed=True)
    assert md.gluon is False and md.transposed and md.block_h == (16 if H <= 16 else 32)
    q, kv, idx, sl = _make(B, q_len, H, top_k, device="cpu")
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cpu")
    lse = poisoned((B, q_len, H), torch.float32, "cpu")
    _call(q, kv, idx, sl, top_k, out=out, lse=lse, bmm1_scale=0.05, bmm2_scale=1.5, metadata=md)
    _check(out, lse, q, kv, idx, sl, 0.05, 1.5)


@pytest.mark.parametrize("kw,match", [
    (dict(num_stages=6), "num_stages"),
    (dict(num_stages=4), "num_stages"),  # the one-warpgroup kernel (default at 16 heads): 2 or 3
    (dict(num_stages=4, num_warps=4), "num_stages"),
    (dict(block_n=16), "block_n"),
    (dict(num_warps=2), "num_warps"),
    (dict(prefetch_idx=True), "prefetch_idx"),
    (dict(chains=3), "chains"),
    (dict(chains=2, num_warps=8), "chains=2"),
])
def test_small_h_plan_rejects_other_configurations(kw, match):
    with pytest.raises(ValueError, match=match):
        plan_decode(2, 1, 16, 2048, "cpu", gluon=True, transposed=True, **kw)


@pytest.mark.parametrize("kw", [dict(), dict(gluon=True, block_h=64), dict(gluon=True, transposed=True, block_h=32)])
def test_small_h_dual_plan_needs_the_one_warpgroup_kernel(kw):
    """``chains=2`` is the one-warpgroup kernel's option: any other kernel raises (on the
    CPU too, before the device check)."""
    with pytest.raises(ValueError, match="chains=2"):
        plan_decode(2, 1, 16, 2048, "cpu", chains=2, **kw)


@interpreter_only
def test_small_h_dual_plan_falls_back_on_cpu(triton_backend):
    """Off the GPU ``chains=2`` plans the plain kernel with ``num_splits`` programs."""
    md = plan_decode(3, 2, 16, 128, "cpu", gluon=True, transposed=True, chains=2, num_splits=2)
    assert md.gluon is False and md.chains == 1 and md.num_splits == 2 and md.split_blocks == 1


def test_small_h_plan_only_when_asked():
    """``gluon=True`` alone still means the 64-head kernel (block_h 64 required)."""
    with pytest.raises(ValueError, match="block_h"):
        plan_decode(2, 1, 16, 2048, "cpu", gluon=True)
    md = plan_decode(2, 1, 16, 2048, "cpu", gluon=True, transposed=True, num_stages=3)
    assert md.num_stages == 3 and md.block_n == 64 and md.num_warps == 8


# ------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def small_h_ok():
    require_self_check("mate.ops.sparse_mla.decode_gluon_small_h")


def _plan(B, q_len, H, top_k, **kw):
    md = plan_decode(B, q_len, H, top_k, "cuda", gluon=True, transposed=True, **kw)
    assert md.gluon and md.transposed and md.block_h in (16, 32)
    assert md.num_warps == kw.get("num_warps", 4 if md.block_h == 16 else 8)
    if "chains" in kw or "num_splits" in kw or md.num_warps == 8:
        assert md.chains == kw.get("chains", 1)
    return md


def _dual_plan(B, q_len, H, top_k, **kw):
    return _plan(B, q_len, H, top_k, chains=2, **kw)


@gpu
@pytest.mark.parametrize("H", [16, 32, 20])
@pytest.mark.parametrize("B,q_len,top_k", [(1, 1, 2112), (8, 2, 2048), (128, 1, 2048), (3, 2, 2112), (1, 2, 2048)])
def test_gpu_small_h_decode_matches_reference(small_h_ok, H, B, q_len, top_k):
    """Invalid slots (-1, out of range, INT_MIN), duplicates, partial seq_lens, an empty
    batch element (B > 2), and the plan's split (B = 1, 3, 8) or no split (B = 128)."""
    check_decode(_plan, B, q_len, H, top_k, four_d=B == 3)


@gpu
@pytest.mark.parametrize("H", [16, 32])
@pytest.mark.parametrize("kw", [dict(num_splits=1), dict(num_splits=5), dict(num_stages=2), dict(num_stages=3),
                                dict(num_warps=8, num_stages=4), dict(num_warps=4, num_stages=3),
                                dict(partial_dtype=torch.float32), dict(seq_lens=None)])
def test_gpu_small_h_plan_variants(small_h_ok, H, kw):
    """Both kernels (4 warps: one warpgroup, 8 warps) at both head counts."""
    check_decode(_plan, 4, 2, H, 2048, **kw)


@gpu
@pytest.mark.parametrize("H,stages,splits,early,pv_fp8", [(16, 5, 1, False, False), (32, 3, 2, False, False),
                                                          (16, 2, 1, False, False), (32, 4, 3, True, False),
                                                          (16, 2, 2, True, True), (32, 3, 1, False, True),
                                                          (32, 5, 3, True, True), (20, 2, 1, True, True)])
def test_gpu_small_h_launch_variants(small_h_ok, H, stages, splits, early, pv_fp8):
    """Vᵀ loaded after P·V (``v_early=False``, only the launcher selects it) or early; P·V in
    fp16 or (``pv_fp8``) on FP8 tensor cores, where Vᵀ is read at the top of each iteration."""
    from mate.ops.sparse_mla.decode_gluon_small_h import sparse_mla_decode_gluon_small_h

    B, q_len, top_k = 3, 2, 2048
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    md = _plan(B, q_len, H, top_k, num_splits=splits, num_stages=stages, num_warps=8)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    sparse_mla_decode_gluon_small_h(q, kv.view(-1, 576), idx, sl, out, lse, md.partial_o, md.partial_lse, S1, 1.25,
                                    md.block_h, md.num_splits, md.split_blocks, md.num_stages, v_early=early,
                                    num_warps=8, pv_fp8=pv_fp8)
    _check(out, lse, q, kv, idx, sl, S1, 1.25)


@gpu
@pytest.mark.parametrize("splits", [1, 4])
def test_gpu_small_h_empty_rows_and_all_invalid(small_h_ok, splits):
    check_empty_rows_and_all_invalid(_plan, 16, splits)


@gpu
def test_gpu_small_h_unaligned_cache_takes_plain_kernel(small_h_ok):
    check_unaligned_cache(_plan, 16)


@gpu
@pytest.mark.parametrize("H", [16, 32])
def test_gpu_small_h_cuda_graph_replay_and_no_allocation(small_h_ok, H):
    md = _plan(4, 2, H, 2048)
    assert md.num_splits > 1 and md.num_stages == (GLUON_WG_STAGES if H == 16 else GLUON_SMALL_H_STAGES)
    check_graph_replay(4, 2, H, 2048, md)


@gpu
@pytest.mark.parametrize("H", [16, 32])
def test_gpu_small_h_repeated_decodes_bit_identical(small_h_ok, H):
    assert count_unequal_repeats(4, 2, H, 2048, _plan(4, 2, H, 2048), 50) == 0


@gpu
@pytest.mark.parametrize("pv_fp8", [False, True])
@pytest.mark.parametrize("chains", [1, 2])
@pytest.mark.parametrize("H,B,q_len,splits,stages", [(16, 3, 2, 2, 2), (16, 128, 1, 2, 2), (32, 3, 2, 3, 2),
                                                     (20, 2, 1, 1, 2), (16, 4, 1, 4, 3), (16, 2, 1, 8, 2),
                                                     (16, 2, 1, 16, 2)])
def test_gpu_small_h_one_warpgroup_kernel(small_h_ok, H, B, q_len, splits, stages, chains, pv_fp8):
    """The one-warpgroup kernel (``decode_gluon_small_h2.py``) and its dual kernel (two chains
    per program) against the reference: invalid slots, partial seq_lens, an empty batch
    element (B > 2), split and unsplit plans, splits of 4 and 2 (dual: 1) blocks."""
    from mate.ops.sparse_mla.decode_gluon_small_h2 import sparse_mla_decode_gluon_small_h_wg

    top_k = 2048
    if chains == 2 and (H > 16 or stages != 2):
        pytest.skip("the dual kernel is the 16-head one-warpgroup kernel's option, at 2 stages")
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda")
    md = _plan(B, q_len, H, top_k, num_splits=splits, **({"chains": 2} if chains == 2 else {}))
    assert md.num_splits == splits and md.chains == chains
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    sparse_mla_decode_gluon_small_h_wg(q, kv.view(-1, 576), idx, sl, out, lse, md.partial_o, md.partial_lse, S1, 1.25,
                                       md.block_h, md.num_splits, md.split_blocks, stages, chains=md.chains,
                                       pv_fp8=pv_fp8)
    _check(out, lse, q, kv, idx, sl, S1, 1.25)


@gpu
@pytest.mark.parametrize("pv_fp8", [False, True])
@pytest.mark.parametrize("chains", [1, 2])
@pytest.mark.parametrize("H,splits,stages", [(16, 1, 2), (16, 2, 2), (16, 3, 2), (12, 3, 3), (16, 2, 3), (12, 3, 2)])
def test_gpu_small_h_one_warpgroup_short_and_empty_rows(small_h_ok, H, splits, stages, chains, pv_fp8):
    """The one-warpgroup kernel (ring slot refilled before the wait for the next block) on 1-3
    splits with -1 / out-of-range / INT_MIN slots and seq_lens 0, 1, 2, 65 (one block and one
    slot past it), 700 (inside the 11-block split 0 of 3), 704 and 705 (at a split boundary and
    one past), full: splits with no valid slot, single-slot blocks and partial last blocks.
    ``chains`` 2: the dual kernel (each program's second chain starts where its first ends;
    with 3 programs the last one's second chain is past top-k)."""
    from mate.ops.sparse_mla.decode_gluon_small_h2 import sparse_mla_decode_gluon_small_h_wg

    if chains == 2 and stages != 2:
        pytest.skip("the dual kernel runs 2 stages")
    top_k = 2048
    seq_lens = [0, 1, 2, 65, 700, 704, 705, top_k]
    B, q_len = len(seq_lens), 2
    q, kv, idx, sl = _make(B, q_len, H, top_k, pages=64, page_size=64, device="cuda", seq_lens=seq_lens)
    md = _plan(B, q_len, H, top_k, num_splits=splits, **({"chains": 2} if chains == 2 else {}))
    assert md.num_warps == 4 and md.num_splits == splits
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    sparse_mla_decode_gluon_small_h_wg(q, kv.view(-1, 576), idx, sl, out, lse, md.partial_o, md.partial_lse, S1, 1.25,
                                       md.block_h, md.num_splits, md.split_blocks, stages, chains=md.chains,
                                       pv_fp8=pv_fp8)
    _check(out, lse, q, kv, idx, sl, S1, 1.25)
    assert_equal(out[0], torch.zeros_like(out[0]))
    assert_equal(lse[0], torch.full_like(lse[0], float("inf")))


@gpu
@pytest.mark.parametrize("chains,splits", [(1, 1), (1, 2), (2, 1)])
@pytest.mark.parametrize("amplitude", [1.0, 4.0])
def test_gpu_small_h_one_warpgroup_large_same_signed_logits(small_h_ok, chains, splits, amplitude):
    """Logits that grow along the top-k list (sorted rows of a ramp cache, so the running max
    rises block after block), peak in its first block (reversed) or anywhere (shuffled), up to
    ~210 (log2 units), with seeded noise on the rows and queries. The output meets the usual
    tolerance; the LSE carries the FP8 tensor cores' accumulation error, which for same-signed
    products is a bias towards zero: H200, 2026-11-30, every decode kernel alike, -0.21 at LSE
    39.6 and -0.86 at 147.4 (~0.55%; the reference agrees with float64 to 1e-5), so it is held
    to 1%. At 15x
    this scale (|logit| ~3e3) that error exceeds the gap between neighbouring rows' logits and
    the output follows another row than the exact reference's."""
    from mate.ops.sparse_mla.decode_gluon_small_h2 import sparse_mla_decode_gluon_small_h_wg

    B, q_len, H, top_k = 3, 1, 16, 2048
    rows = 64 * 64
    gen = torch.Generator().manual_seed(7)  # the inputs the H200 run checked (see the docstring)
    ramp = torch.linspace(-amplitude, amplitude, rows)
    kv = (ramp[:, None] * (0.75 + 0.5 * torch.rand(rows, 576, generator=gen))).to(torch.float8_e4m3fn)
    q = (1 + torch.rand(B, q_len, H, 576, generator=gen)).to(torch.float8_e4m3fn)
    order = torch.randperm(rows, generator=gen)[:top_k].sort().values
    idx = torch.stack([order, order.flip(0), order[torch.randperm(top_k, generator=gen)]]).view(B, q_len, top_k)
    idx, sl = idx.to(torch.int32), torch.full((B,), top_k, dtype=torch.int32)
    ref_o, ref_l = sparse_mla_decode_reference(q, kv.view(64, 64, 576), idx, sl, S1, 1.25)
    md = _plan(B, q_len, H, top_k, num_splits=splits, **({"chains": 2} if chains == 2 else {}))
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    lse = poisoned((B, q_len, H), torch.float32, "cuda")
    sparse_mla_decode_gluon_small_h_wg(q.cuda(), kv.cuda(), idx.cuda(), sl.cuda(), out, lse, md.partial_o,
                                       md.partial_lse, S1, 1.25, md.block_h, md.num_splits, md.split_blocks, 2,
                                       chains=md.chains)
    assert_close(out, ref_o, name="out", **GPU_OUT_TOL)
    assert_close(lse.reshape(ref_l.shape), ref_l, name="lse", atol=1.5e-2, rtol=1e-2)


@gpu
@pytest.mark.parametrize("B,q_len", [(128, 1), (4, 2), (1, 1)])
def test_gpu_small_h_dual_plans(small_h_ok, B, q_len):
    """The dual kernel through the public op on its plans, with and without seq_lens: B=128 q1
    needs no combine (one program of two chains), smaller batches combine fewer programs than
    chains."""
    check_decode(_dual_plan, B, q_len, 16, 2048)
    check_decode(_dual_plan, B, q_len, 16, 2048, seq_lens=None)
    md = _dual_plan(B, q_len, 16, 2048)
    assert md.num_splits == (1 if B == 128 else md.num_splits) and md.split_blocks * md.num_splits * 2 >= 32


@gpu
def test_gpu_small_h_dual_empty_rows_unaligned_graph_and_repeats(small_h_ok):
    """Empty rows and all-invalid chains, the plain fallback for an unaligned cache (each
    program's slots = both chains'), CUDA-graph replay without allocation, 50 repeats
    bit-identical."""
    check_empty_rows_and_all_invalid(_dual_plan, 16, 2)
    check_unaligned_cache(_dual_plan, 16)
    md = _dual_plan(4, 2, 16, 2048)
    assert md.num_splits > 1
    check_graph_replay(4, 2, 16, 2048, md)
    assert count_unequal_repeats(128, 1, 16, 2048, _dual_plan(128, 1, 16, 2048), 50) == 0


def test_small_h_one_warpgroup_launch_validated():
    """Launcher arguments are checked before anything runs (on the CPU too)."""
    from mate.ops.sparse_mla.decode_gluon_small_h2 import sparse_mla_decode_gluon_small_h_wg

    q = torch.zeros(1, 1, 16, 576, dtype=torch.float8_e4m3fn)
    e = torch.empty(0)
    with pytest.raises(ValueError, match="dual kernel needs num_stages 2"):
        sparse_mla_decode_gluon_small_h_wg(q, e, e, None, e, e, e, e, 1.0, 1.0, 16, 2, 16, 3, chains=2)
    with pytest.raises(ValueError, match="num_stages"):
        sparse_mla_decode_gluon_small_h_wg(q, e, e, None, e, e, e, e, 1.0, 1.0, 16, 2, 16, 4)
    with pytest.raises(ValueError, match="block_h"):
        sparse_mla_decode_gluon_small_h_wg(q, e, e, None, e, e, e, e, 1.0, 1.0, 8, 2, 16, 2)


def test_small_h_one_warpgroup_perm_values_is_the_renaming_of_load_vt_half():
    """The same for an Oᵀ half of the one-warpgroup kernel (256 value rows)."""
    d = torch.arange(256)
    renamed = d.view(4, 8, 4, 2).permute(2, 0, 3, 1).reshape(256)
    from mate.ops.sparse_mla.decode_gluon_small_h import _perm_values

    assert_equal(renamed, _perm_values(torch.arange(256), 256))


@pytest.mark.parametrize("N", [256, 512])
def test_small_h_natural_rows_undoes_perm_values(N):
    """``_natural_rows``' reshape + permute (the same index arithmetic on torch tensors) puts the
    rows of an Oᵀ (N = 256: a one-warpgroup half; 512: the 8-warp kernel) back in value order, so
    the store can write consecutive values; ``natural_layout`` then gives each thread 8 of them."""
    from mate.ops.sparse_mla.decode_gluon_small_h import _perm_values, natural_layout

    values = _perm_values(torch.arange(N), N)  # value held by row m
    ordered = values.view(2, 2, N // 64, 2, 8).permute(2, 4, 0, 1, 3).reshape(N)
    assert_equal(ordered, torch.arange(N))
    layout = natural_layout.fn(N, 32)
    assert layout.reg_bases[:3] == [[1, 0], [2, 0], [4, 0]] and layout.shape == [N, 32]
    assert 2 ** len(layout.warp_bases) == N // 64  # 4 warps for 256 rows, 8 for 512
