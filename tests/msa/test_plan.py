"""MSA plans and planners, msa() argument rules, page tables, and the no-host-sync scan."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch

import mate.msa_interface as mi
from mate.msa_interface import (
    MsaPlanInfo,
    MsaRuntimeMetadata,
    _msa_plan_from_lengths,
    build_page_table_from_flat_kv_indices,
    msa,
    msa_plan,
    sparse_msa_plan,
)
from mate.ops.msa import maxscore, reference_select, topk
from mate.testing import assert_equal

T = torch.tensor


# ----------------------------------------------------------------------------- eager planner


def test_eager_plan_lengths_pointers_and_default_offset():
    qo = torch.randint(1, 40, (5,))
    kv = qo + torch.randint(0, 700, (5,))
    info = _msa_plan_from_lengths(qo, kv, 8, 2, page_size=128, split_prefill_decode=False)
    p = info.plan
    assert isinstance(info, MsaPlanInfo) and not info.has_mixed_prefill and info.split == 5 and info.batch_size == 5
    assert p.mode == "paged" and not p.is_static and p.selected_block_count == 0
    cu_q = torch.cat([T([0]), qo.cumsum(0)]).int()
    cu_k = torch.cat([T([0]), kv.cumsum(0)]).int()
    assert_equal(p.prefill_plan.cu_seqlens_q, cu_q)
    assert_equal(p.prefill_plan.cu_seqlens_k, cu_k)
    assert_equal(p.qo_offset, (kv - qo).int())
    assert_equal(p.kv_page_indptr, torch.cat([T([0]), ((kv + 127) // 128).cumsum(0)]).int())
    assert_equal(p.decode_plan.cache_seqlens, kv.int())
    assert p.prefill_plan.max_seqlen_q == int(qo.max()) and p.prefill_plan.max_seqlen_k == int(kv.max())
    assert p.prefill_plan.total_seqlen_k == int(kv.sum()) and p.prefill_plan.total_seqlen_q == int(qo.sum())
    assert p.max_k_tiles == -(-int(kv.max()) // 128)


def test_eager_plan_modes_and_thresholds():
    def mode(qo, **kw):
        return _msa_plan_from_lengths(T(qo), T([4096] * len(qo)), 4, 4, split_prefill_decode=False, **kw).plan.mode

    assert mode([5]) == "dense"
    assert mode([5], page_size=64) == "paged"
    assert mode([32, 1], kv_block_num=16, page_size=128) == "sparse_decode"
    assert mode([33, 1], kv_block_num=16, page_size=128) == "sparse_prefill"
    assert mode([1], kv_block_num=8, page_size=128, sparse_kernel_mode="prefill") == "sparse_prefill"
    assert mode([500], kv_block_num=8, page_size=128, sparse_kernel_mode="decode") == "sparse_decode"


@pytest.mark.parametrize("sparse", [True, False])
def test_mixed_split_decode_first(sparse):
    thr = 32 if sparse else 128
    kw = dict(kv_block_num=16, page_size=128) if sparse else dict(page_size=128)
    qo = T([1, thr, thr + 1, 300])
    kv = T([1000, 900, 800, 700])
    info = _msa_plan_from_lengths(qo, kv, 8, 4, **kw)
    assert info.has_mixed_prefill and info.split == 2 and info.batch_size == 4
    dec, pre = info.plan, info.prefill_plan_or_None
    assert dec.batch_size == 2 and pre.batch_size == 2
    if sparse:
        assert (dec.mode, pre.mode) == ("sparse_decode", "sparse_prefill")
    # query offsets are rebased per part; page pointers stay absolute into the flat kv_indices
    assert_equal(pre.prefill_plan.cu_seqlens_q, T([0, thr + 1, thr + 301]).int())
    assert_equal(pre.kv_page_indptr, T([16, 23, 29]).int())  # pages 8, 8 | 7, 6
    assert dec.prefill_plan.total_seqlen_q == 1 + thr
    # not decode-first, or a single kind of request: no split
    assert not _msa_plan_from_lengths(T([300, 1]), T([900, 900]), 8, 4, **kw).has_mixed_prefill
    assert not _msa_plan_from_lengths(T([1, 2]), T([900, 900]), 8, 4, **kw).has_mixed_prefill
    assert not _msa_plan_from_lengths(qo, kv, 8, 4, split_prefill_decode=False, **kw).has_mixed_prefill


@pytest.mark.parametrize("counted,expect", [(True, 16), (False, 19)])
def test_selected_block_count(counted, expect):
    info = _msa_plan_from_lengths(T([40]), T([4000]), 8, 1, kv_block_num=16, page_size=128, force_begin_blocks=1,
                                  force_end_blocks=2, force_blocks_count_in_topk=counted)
    assert info.plan.selected_block_count == expect


def test_custom_qo_offset_and_sparse_msa_plan():
    info = _msa_plan_from_lengths(T([4, 4]), T([100, 200]), 2, qo_offset=T([3, 7]))
    assert_equal(info.plan.qo_offset, T([3, 7]).int())
    assert not info.plan.default_qo_offset
    info = _msa_plan_from_lengths(T([4, 4]), T([100, 200]), 2, qo_offset=5)
    assert_equal(info.plan.qo_offset, T([5, 5]).int())
    sp = sparse_msa_plan(T([1, 2]), T([500, 600]), 8, 2, kv_block_num=8)
    assert sp.plan.mode == "sparse_prefill" and not sp.has_mixed_prefill
    with pytest.raises(ValueError, match="sparse_msa_plan"):
        sparse_msa_plan(T([1, 2]), T([500, 600]), 8, 2, kv_block_num=-1)
    with pytest.raises(TypeError, match="sparse_kernel_mode"):
        sparse_msa_plan(T([1]), T([500]), 8, 2, sparse_kernel_mode="decode")


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(num_qo_heads=6, num_kv_heads=4), ValueError, "num_qo_heads"),
        (dict(num_qo_heads=0), ValueError, "num_qo_heads"),
        (dict(num_kv_heads=-2), ValueError, "num_kv_heads"),
        (dict(num_qo_heads=4.0), TypeError, "num_qo_heads"),
        (dict(kv_block_num=5, page_size=128), ValueError, "kv_block_num"),
        (dict(kv_block_num=16, page_size=64), ValueError, "page_size"),
        (dict(kv_block_num=16, page_size=128, sparse_block_size=64), ValueError, "sparse_block_size"),
        (dict(kv_block_num=4, page_size=128, force_begin_blocks=3, force_end_blocks=2), ValueError, "force_begin"),
        (dict(kv_block_num=16, page_size=128, force_begin_blocks=30, force_end_blocks=30,
              force_blocks_count_in_topk=False), ValueError, "64"),
        (dict(force_end_blocks=1), ValueError, "force_"),
        (dict(output_maxscore=True, page_size=64), ValueError, "page_size"),
        (dict(page_size=100), ValueError, "page_size"),
        (dict(sparse_kernel_mode="fast"), ValueError, "sparse_kernel_mode"),
        (dict(num_kv_splits=0), ValueError, "num_kv_splits"),
    ],
)
def test_planner_errors(kw, exc, match):
    args = dict(num_qo_heads=8, num_kv_heads=4)
    args.update(kw)
    h, hk = args.pop("num_qo_heads"), args.pop("num_kv_heads")
    with pytest.raises(exc, match=match):
        _msa_plan_from_lengths(T([4]), T([400]), h, hk, **args)
    with pytest.raises(exc, match=match):
        msa_plan(2, 4, 400, h, num_kv_heads=hk, **args)


def test_planner_rejects_device_lengths_and_bad_lengths():
    with pytest.raises(ValueError, match="qo_lens"):
        _msa_plan_from_lengths(torch.ones(2, dtype=torch.int32, device="meta"), T([4, 4]), 2)
    with pytest.raises(ValueError, match="kv_lens"):
        _msa_plan_from_lengths(T([4, 4]), torch.ones(2, dtype=torch.int32, device="meta"), 2)
    with pytest.raises(ValueError, match="kv_lens"):
        _msa_plan_from_lengths(T([4, 4]), T([4]), 2)
    with pytest.raises(ValueError, match="qo_lens"):
        _msa_plan_from_lengths(T([-1]), T([4]), 2)
    with pytest.raises(TypeError, match="qo_lens"):
        _msa_plan_from_lengths(torch.ones(2), T([4, 4]), 2)


def test_static_plan_and_its_errors():
    info = msa_plan(3, 64, 1000, 8, num_kv_heads=2, page_size=128, kv_block_num=16)
    p = info.plan
    assert p.is_static and p.mode == "sparse_prefill" and p.batch_size == 3 and p.max_pages == 8
    assert p.prefill_plan.cu_seqlens_q is None and p.prefill_plan.total_seqlen_k == 3000
    assert msa_plan(3, 32, 1000, 8, page_size=128, kv_block_num=16).plan.mode == "sparse_decode"
    with pytest.raises(ValueError, match="batch_size"):
        msa_plan(0, 4, 100, 4)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        msa_plan(2, -1, 100, 4)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        msa_plan(2, 4, 0, 4)
    with pytest.raises(ValueError, match="total_seqlen_k"):
        msa_plan(2, 4, 100, 4, total_seqlen_k=10)


# ----------------------------------------------------------------------------- msa() argument rules


def _paged(B=2, hq=4, hk=2, d=64, pages=8, dtype=torch.bfloat16):
    q = torch.randn(B * 3, hq, d).to(dtype)
    k = torch.randn(pages, 128, hk, d).to(dtype)
    pt = torch.randperm(pages)[: B * 2].view(B, 2).int()
    return q, k, pt


def test_msa_argument_rules(reference_backend):
    q, k, pt = _paged()
    info = _msa_plan_from_lengths(T([3, 3]), T([200, 150]), 4, 2, page_size=128)
    with pytest.raises(TypeError, match="bogus"):
        msa(q, k, k, info, page_table=pt, bogus=1)
    with pytest.raises(ValueError, match="output_o"):
        msa(q, k, k, info, page_table=pt, output_o=False, output_maxscore=False)
    with pytest.raises(NotImplementedError, match="kv_block_indexes"):
        msa(q, k, k, info, page_table=pt, output_maxscore=True, kv_block_indexes=torch.zeros(6, 2, 16).int())
    sinfo = _msa_plan_from_lengths(T([3, 3]), T([200, 150]), 4, 2, page_size=128, kv_block_num=16)
    with pytest.raises(NotImplementedError, match="sparse"):
        msa(q, k, k, sinfo, page_table=pt, output_maxscore=True)
    with pytest.raises(ValueError, match="kv_block_indexes"):
        msa(q, k, k, sinfo, page_table=pt)
    with pytest.raises(ValueError, match="kv_block_indexes"):
        msa(q, k, k, sinfo, page_table=pt, kv_block_indexes=torch.zeros(6, 2, 8).int())
    with pytest.raises(TypeError, match="k must be torch.float16"):
        msa(q.half(), k, k, info, page_table=pt, output_o=False, output_maxscore=True)
    with pytest.raises(ValueError, match="page_table"):
        msa(q, k, k, info, page_table=pt[:, :1], output_o=False, output_maxscore=True)
    with pytest.raises(ValueError, match="page_table or kv_indices"):
        msa(q, k, k, info, output_o=False, output_maxscore=True)
    with pytest.raises(ValueError, match="max_score"):
        msa(q, k, k, info, page_table=pt, max_score=torch.empty(6, 4, 1))
    with pytest.raises(TypeError, match="max_score"):
        msa(q, k, k, info, page_table=pt, max_score=torch.empty(6, 4, 2, dtype=torch.float16))
    rt = MsaRuntimeMetadata(None, None, None, T([0, 3, 6]).int(), T([0, 200, 350]).int(), seqused_k=T([200, 150]).int(),
                            page_table=pt)
    with pytest.raises(ValueError, match="q_offset_override"):
        msa(q, k, k, info, runtime_metadata=rt, q_offset_override=3, output_o=False, output_maxscore=True)
    with pytest.raises(ValueError, match="q_offset_override"):
        msa(q, k, k, info, page_table=pt, q_offset_override=T([1, 2, 3]).int(), output_o=False, output_maxscore=True)


def test_static_plan_needs_complete_runtime_metadata(reference_backend):
    q, k, pt = _paged()
    info = msa_plan(2, 3, 256, 4, num_kv_heads=2, page_size=128, output_maxscore=True)
    with pytest.raises(ValueError, match="runtime_metadata"):
        msa(q, k, None, info, page_table=pt, output_o=False)
    cu_q, cu_k, used = T([0, 3, 6]).int(), T([0, 200, 350]).int(), T([200, 150]).int()
    with pytest.raises(ValueError, match="seqused_k"):
        msa(q, k, None, info, output_o=False, runtime_metadata=MsaRuntimeMetadata(None, None, None, cu_q, cu_k,
                                                                                   page_table=pt))
    with pytest.raises(ValueError, match="page_table"):
        msa(q, k, None, info, output_o=False, runtime_metadata=MsaRuntimeMetadata(None, None, None, cu_q, cu_k,
                                                                                   seqused_k=used))
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        msa(q, k, None, info, output_o=False, runtime_metadata=MsaRuntimeMetadata(
            None, None, None, cu_q.long(), cu_k, seqused_k=used, page_table=pt))
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        msa(q, k, None, info, output_o=False, runtime_metadata=MsaRuntimeMetadata(
            None, None, None, cu_q, cu_k[:2], seqused_k=used, page_table=pt))
    _, ms = msa(q, k, None, info, output_o=False, runtime_metadata=MsaRuntimeMetadata(
        None, None, None, cu_q, cu_k, seqused_k=used, page_table=pt))
    assert ms.shape == (6, 4, 2)


def test_batch_of_zero_returns_empty_outputs(reference_backend):
    info = _msa_plan_from_lengths(torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 4, 2,
                                  page_size=128, output_maxscore=True)
    q = torch.empty(0, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 128, 2, 64).bfloat16()
    o, ms = msa(q, k, None, info, output_o=False, page_table=torch.zeros(0, 1, dtype=torch.int32))
    assert o is None and ms.shape == (0, 4, 0)


# ----------------------------------------------------------------------------- page tables


def test_build_page_table_example_and_mismatch():
    table = build_page_table_from_flat_kv_indices(T([3, 5, 7, 11, 13]).int(), T([300, 250]), 128)
    assert_equal(table, T([[3, 5, 7], [11, 13, 0]]).int())
    with pytest.raises(ValueError, match="kv_indices"):
        build_page_table_from_flat_kv_indices(T([3, 5, 7, 11, 13]).int(), T([300, 260]), 128)
    # the device-side builder used by msa() agrees on random layouts
    kv = torch.randint(0, 1000, (6,))
    pages = (kv + 127) // 128
    idx = torch.randperm(int(pages.sum()) + 3)[: int(pages.sum())].int()
    ref = build_page_table_from_flat_kv_indices(idx, kv, 128)
    indptr = torch.cat([T([0]), pages.cumsum(0)]).int()
    assert_equal(mi._page_table_from_flat(idx, indptr, ref.shape[1]), ref)


# ----------------------------------------------------------------------------- no host syncs

# planning/preparation functions may read host values; everything else is an execution path
_PREPARATION = {"build_page_table_from_flat_kv_indices", "_check_block_indexes_valid"}


def _host_syncs(source: str) -> list[str]:
    """Calls of .item() / .tolist() / .cpu() / .to("cpu") in code (not in docstrings or comments)."""
    hits = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            to_cpu = name == "to" and any(isinstance(a, ast.Constant) and a.value == "cpu" for a in node.args)
            if name in ("item", "tolist", "cpu") or to_cpu:
                hits.append(ast.unparse(node))
    return hits


def test_execution_path_has_no_host_syncs():
    sources = [inspect.getsource(m) for m in (maxscore, topk, reference_select)]
    for name, fn in inspect.getmembers(mi, inspect.isfunction):
        if fn.__module__ == mi.__name__ and name not in _PREPARATION:
            sources.append(inspect.getsource(fn))
    for op in (mi._max_score_op, mi._topk_select_op):
        sources.append(inspect.getsource(op.fn))
    hits = [h for src in sources for h in _host_syncs(src)]
    assert not hits, f"host syncs on the execution path: {hits}"
    # the scan itself can fail
    assert _host_syncs("x.item()\ny = t.to('cpu')\nz = t.tolist()") == ["x.item()", "t.to('cpu')", "t.tolist()"]
    assert _host_syncs('"""no .item() here"""  # nor .cpu()') == []


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def test_plans_built_from_the_documented_fields():
    """Dataclasses built with only the spec's fields: the token count, the default-offset flag
    and the page extent are derived (a plan the planner makes sets them itself), so a
    hand-built sparse plan runs like the planner's and a hand-built causal dense plan with a
    custom qo_offset raises NotImplementedError instead of running bottom-right aligned."""
    pp = mi.MsaPrefillPlan(_i32([0, 2, 3]), _i32([0, 200, 330]), 330, 2, 200)
    assert pp.total_seqlen_q == 3
    dp = mi.MsaDecodePlan(_i32([200, 130]), 128, 128)
    plan = mi.MsaPlan(2, _i32([2, 1]), _i32([200, 130]), _i32([198, 129]), _i32([0, 2, 4]), 2, 1, 128, 128, -1, 4,
                      0, 0, True, True, False, "auto", False, "sparse_decode", pp, dp, False)
    assert plan.default_qo_offset and plan.kv_pages_end == 4
    made = mi._msa_plan_from_lengths(torch.tensor([2, 1]), torch.tensor([200, 130]), 2, num_kv_heads=1,
                                     page_size=128, kv_block_num=4, sparse_kernel_mode="decode",
                                     split_prefill_decode=False)
    assert made.plan.default_qo_offset and made.plan.kv_pages_end == 4
    cache = torch.randn(4, 128, 1, 128).half()
    q = torch.randn(3, 2, 128).half()
    idx = torch.randint(-1, 2, (3, 1, 4), dtype=torch.int32)
    table = _i32([[0, 1], [2, 3]])
    mine = mi.msa(q, cache, cache, mi.MsaPlanInfo(False, 2, 2, plan, None), kv_block_indexes=idx, page_table=table)
    theirs = mi.msa(q, cache, cache, made, kv_block_indexes=idx, page_table=table)
    assert torch.equal(mine[0], theirs[0])

    dense_pp = mi.MsaPrefillPlan(_i32([0, 2, 3]), _i32([0, 6, 12]), 12, 2, 6)
    dense = mi.MsaPlan(2, _i32([2, 1]), _i32([6, 6]), _i32([0, 0]), None, 2, 1, -1, 128, -1, -1, 0, 0, True, True,
                       False, "auto", False, "dense", dense_pp, None, False)
    assert not dense.default_qo_offset and dense.kv_pages_end == 0
    qd, kd = torch.randn(3, 2, 32).half(), torch.randn(12, 1, 32).half()
    with pytest.raises(NotImplementedError, match="qo_offset other than kv_len - q_len"):
        mi.msa(qd, kd, kd, mi.MsaPlanInfo(False, 2, 2, dense, None))
    dense.qo_offset = _i32([4, 5])  # reassigned to the default: the flag follows
    assert dense.default_qo_offset
    mi.msa(qd, kd, kd, mi.MsaPlanInfo(False, 2, 2, dense, None))
    made_dense = mi._msa_plan_from_lengths(torch.tensor([2, 1]), torch.tensor([6, 6]), 2, num_kv_heads=1)
    made_dense.plan.qo_offset = _i32([0, 0])  # a planner's plan reassigned to a custom offset
    assert not made_dense.plan.default_qo_offset
    with pytest.raises(NotImplementedError, match="qo_offset other than kv_len - q_len"):
        mi.msa(qd, kd, kd, made_dense)
