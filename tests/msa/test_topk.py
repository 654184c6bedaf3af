"""sparse_topk_select: the reference vs a plain per-row loop, the Triton kernel vs the
reference (exact, many ties), input checks, and on the GPU >= 1,000 random cases, long
rows and the max-score -> top-k pipeline under CUDA-graph capture."""

from __future__ import annotations

import math
import os
import random
import re
from pathlib import Path

import pytest
import torch

from mate._core.env import ENV_VARS
from mate.msa_interface import MsaRuntimeMetadata, _msa_plan_from_lengths, msa, msa_plan, sparse_topk_select
from mate.ops.msa import topk as topk_mod
from mate.ops.msa.reference_select import topk_select_reference
from mate.ops.msa.topk import sparse_topk_select_triton
from mate.testing import assert_equal, poisoned
from mate.testing.graphs import capture_graph


def loop_select(scores, topk, n_valid, fb, fe, counted, qpos):
    """Row by row in Python: sort candidates by (score desc, NaN largest, index asc)."""
    total_q, H, T = scores.shape
    width = topk if counted else topk + fb + fe
    out = torch.full((total_q, H, width), -1, dtype=torch.int32)
    for t in range(total_q):
        n = n_valid
        if qpos is not None:
            p = int(qpos[t])
            n = 0 if p < 0 else min(n, p // 128 + 1)
        for h in range(H):
            if n <= width:
                ids = list(range(n))
            else:
                forced = sorted({i for i in range(min(fb, n))} | {i for i in range(max(n - fe, 0), n)})
                rest = [i for i in range(n) if i not in forced]

                row = scores[t, h].tolist()
                rest.sort(key=lambda i, row=row: (0, 0.0, i) if math.isnan(row[i]) else (1, -row[i], i))
                ids = sorted(forced + rest[: topk - len(forced)]) if counted else sorted(forced + rest[:topk])
            out[t, h, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return out


def random_scores(total_q, H, T, *, levels=None, specials=True, device="cpu", gen=None):
    """Scores with many ties (quantized to `levels` values), NaN, +-inf and -0.0."""
    if levels:
        s = torch.randint(0, levels, (total_q, H, T), generator=gen).float() - levels // 2
    else:
        s = torch.randn(total_q, H, T, generator=gen)
    if specials:
        u = torch.rand(total_q, H, T, generator=gen)
        s[u < 0.03] = float("nan")
        s[(u >= 0.03) & (u < 0.08)] = float("-inf")
        s[(u >= 0.08) & (u < 0.10)] = float("inf")
        s[(u >= 0.10) & (u < 0.14)] = -0.0
    return s.to(device)


def random_config(rng: random.Random, T: int):
    topk = rng.choice([4, 8, 16])
    counted = rng.random() < 0.5
    many = rng.random() < 0.2  # appended forced blocks up to W = 16 + 16 = 32 (the lanes kernels' widest rows)
    fb, fe = rng.randint(0, 8 if many else 2), rng.randint(0, 8 if many else 2)
    if counted and fb + fe > topk:
        fb, fe = 0, min(fe, topk)
    nvp = rng.randint(1, T) if rng.random() < 0.3 else None
    return topk, dict(num_valid_pages=nvp, force_begin_blocks=fb, force_end_blocks=fe,
                      force_blocks_count_in_topk=counted)


def test_reference_matches_loop():
    rng = random.Random()
    for _ in range(12):
        T = rng.randint(1, 40)
        tq, H = rng.randint(1, 4), rng.randint(1, 3)
        s = random_scores(tq, H, T, levels=rng.choice([None, 3, 6]))
        topk, kw = random_config(rng, T)
        qpos = torch.randint(-300, T * 128 + 50, (tq,)) if rng.random() < 0.5 else None
        ref = topk_select_reference(s, query_positions=qpos, topk=topk, num_valid_pages=kw["num_valid_pages"] or T,
                                    force_begin_blocks=kw["force_begin_blocks"],
                                    force_end_blocks=kw["force_end_blocks"],
                                    force_blocks_count_in_topk=kw["force_blocks_count_in_topk"])
        loop = loop_select(s, topk, kw["num_valid_pages"] or T, kw["force_begin_blocks"], kw["force_end_blocks"],
                           kw["force_blocks_count_in_topk"], qpos)
        assert_equal(ref, loop)


def _random_case(Ts, max_tq, levels, device, heads=(1, 3)):
    """Random scores (T from ``Ts``, 4..max_tq tokens), top-k configuration and, half of
    the time, query positions: (s, topk, kw, qpos)."""
    rng = random.Random()
    T = rng.choice(Ts)
    tq, H = rng.randint(4, max_tq), rng.randint(*heads)
    s = random_scores(tq, H, T, levels=levels, device=device)
    topk, kw = random_config(rng, T)
    qpos = torch.randint(-300, T * 128 + 50, (tq,), device=device) if rng.random() < 0.5 else None
    return s, topk, kw, qpos


def _check_kernel(s, topk, kw, qpos, max_chunk=4096, method=None, rows_per_program=None):
    total_q, H, T = s.shape
    width = topk if kw["force_blocks_count_in_topk"] else topk + kw["force_begin_blocks"] + kw["force_end_blocks"]
    ref = topk_select_reference(s, query_positions=qpos, topk=topk, num_valid_pages=kw["num_valid_pages"] or T,
                                force_begin_blocks=kw["force_begin_blocks"], force_end_blocks=kw["force_end_blocks"],
                                force_blocks_count_in_topk=kw["force_blocks_count_in_topk"])
    out = poisoned((total_q, H, width), torch.int32, s.device)
    if max_chunk == 4096 and method is None:
        got = sparse_topk_select(s, topk, output=out, query_positions=qpos, **kw)
        assert got is out
    else:
        sparse_topk_select_triton(s, out, query_positions=qpos, topk=topk, num_valid_pages=kw["num_valid_pages"] or T,
                                  force_begin_blocks=kw["force_begin_blocks"], force_end_blocks=kw["force_end_blocks"],
                                  force_blocks_count_in_topk=kw["force_blocks_count_in_topk"], max_chunk=max_chunk,
                                  method=method, rows_per_program=rows_per_program)
    assert_equal(out, ref)


# Under the interpreter one launch costs ~1 s (the bitonic network is many small ops), so
# each test makes one or two launches; rows inside a launch vary n, ties and specials.
@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("max_chunk", [4096, 16])  # 16: the long-row (tournament) path on short rows
def test_kernel_random_cases_exact(case, max_chunk, device, triton_backend):
    rng = random.Random()
    T = rng.choice([[17, 40, 64, 100], [17, 33, 40, 48]][max_chunk == 16])
    tq, H = rng.randint(4, 12), rng.randint(1, 3)
    s = random_scores(tq, H, T, levels=[None, 2, 5][case], device=device)
    topk, kw = random_config(rng, T)
    qpos = torch.randint(-300, T * 128 + 50, (tq,), device=device) if case != 1 else None
    _check_kernel(s, topk, kw, qpos, max_chunk)


@pytest.mark.parametrize("levels", [None, 3])
def test_bitonic_threshold_random_cases_exact(levels, device, triton_backend):
    """The bitonic threshold (the non-default method) equals the reference too."""
    s, topk, kw, qpos = _random_case([33, 64, 100], 8, levels, device, heads=(2, 2))
    _check_kernel(s, topk, kw, qpos, method="bitonic")


@pytest.mark.parametrize("levels", [None, 2, 5, 40])
def test_radix_threshold_random_cases_exact(levels, device, triton_backend):
    """The radix (bitwise binary search) threshold equals the sort-based reference, with
    ties, NaN, +-inf, -0.0, forced blocks, num_valid_pages and query positions."""
    s, topk, kw, qpos = _random_case([33, 64, 100, 256], 12, levels, device)
    _check_kernel(s, topk, kw, qpos, method="radix", rows_per_program=1)  # the GPU configuration


@pytest.mark.parametrize("levels", [None, 3, 40])
def test_interval_threshold_random_cases_exact(levels, device, triton_backend):
    """The interval bisection threshold equals the reference, with one or two rows per
    program (rows of one program stop their search at different steps)."""
    s, topk, kw, qpos = _random_case([33, 64, 100, 256], 10, levels, device)
    _check_kernel(s, topk, kw, qpos, method="interval", rows_per_program=random.choice([1, 2]))


@pytest.mark.parametrize("method", ["radix", "interval", "lanes"])
@pytest.mark.parametrize("counted", [True, False])
def test_radix_threshold_close_values_and_special_rows(counted, method, device, triton_backend):
    """Rows whose keys differ only in the last mantissa bits (the search runs all 32 bits),
    negative rows, a K-th value tied across the row, all-equal, all -inf and all-NaN rows,
    and -0.0 against +0.0 (equal keys, ties to the lower index)."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    ulps = torch.randint(0, 6, (2, 2, 64), generator=g, dtype=torch.int32)
    close = (torch.ones(2, 2, 64).view(torch.int32) + ulps).view(torch.float32)
    neg = -close
    zeros = torch.where(torch.rand(1, 2, 64, generator=g) < 0.5, -0.0, 0.0)
    kth_tie = torch.randn(1, 2, 64, generator=g)
    kth_tie[..., 20:40] = 0.5
    kth_tie[..., :5] = 3.0
    s = torch.cat([close, neg, zeros, kth_tie, torch.zeros(1, 2, 64), torch.full((1, 2, 64), float("-inf")),
                   torch.full((1, 2, 64), float("nan"))]).to(device)
    kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=2, force_blocks_count_in_topk=counted)
    _check_kernel(s, 8, kw, None, method=method)  # several rows per program: rows exit the search together
    _check_kernel(s, 16, dict(kw, force_begin_blocks=0, force_end_blocks=0), None, method=method, rows_per_program=1)
    # 8 forced blocks (counted: they fill the top-8, the threshold is their key, the largest)
    _check_kernel(s, 8, dict(kw, force_begin_blocks=4, force_end_blocks=4), None, method=method, rows_per_program=1)


def test_method_is_checked():
    s = torch.zeros(1, 1, 8)
    out = torch.empty(1, 1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="method"):
        sparse_topk_select_triton(s, out, query_positions=None, num_valid_pages=8, topk=4, force_begin_blocks=0,
                                  force_end_blocks=0, force_blocks_count_in_topk=True, method="heap")


def test_method_default_matches_environment_docs():
    """``MATE_MSA_TOPK_METHOD``'s default (the code's, from ENV_VARS) is a method and the
    one docs/guides/environment.md gives."""
    default = ENV_VARS["MATE_MSA_TOPK_METHOD"][0]
    assert default in topk_mod.TOPK_METHODS
    if "MATE_MSA_TOPK_METHOD" not in os.environ:
        assert default == topk_mod.TOPK_METHOD
    page = (Path(__file__).parents[2] / "docs" / "guides" / "environment.md").read_text()
    assert re.search(rf"^\| `MATE_MSA_TOPK_METHOD` \| `{default}` \|", page, re.M)


@pytest.mark.parametrize("counted", [True, False])
def test_kernel_special_rows(counted, device, triton_backend):
    # all-equal rows, all -inf rows, all-NaN rows and random rows in one launch
    s = torch.cat([torch.zeros(2, 2, 64), torch.full((2, 2, 64), float("-inf")), torch.full((2, 2, 64), float("nan")),
                   torch.randn(2, 2, 64)]).to(device)
    kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=2, force_blocks_count_in_topk=counted)
    _check_kernel(s, 8, kw, None)


def test_kernel_identity_fast_path(device, triton_backend):
    # n <= width everywhere: rows are 0 .. n-1 then -1, without the selection step
    s = torch.randn(4, 1, 64, device=device)
    out = sparse_topk_select(s, 16, num_valid_pages=5)
    assert_equal(out.cpu(), torch.tensor([0, 1, 2, 3, 4] + [-1] * 11, dtype=torch.int32).expand(4, 1, 16))
    kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=2, force_blocks_count_in_topk=False)
    _check_kernel(torch.randn(3, 2, 10, device=device), 8, kw, None)
    out = sparse_topk_select(torch.empty(0, 4, 8, device=device), 4)
    assert out.shape == (0, 4, 4)


def test_input_checks(device):
    s = torch.randn(4, 2, 32, device=device)
    with pytest.raises(TypeError, match="max_score"):
        sparse_topk_select(s.half(), 4)
    with pytest.raises(ValueError, match="max_score"):
        sparse_topk_select(s[:, :1], 4)
    with pytest.raises(ValueError, match="max_score"):
        sparse_topk_select(s.transpose(0, 1), 4)
    with pytest.raises(ValueError, match="max_score"):
        sparse_topk_select(s[0], 4)
    with pytest.raises(ValueError, match="topk"):
        sparse_topk_select(s, 5)
    with pytest.raises(TypeError, match="topk"):
        sparse_topk_select(s, 4.0)
    with pytest.raises(ValueError, match="num_valid_pages"):
        sparse_topk_select(s, 4, num_valid_pages=0)
    with pytest.raises(ValueError, match="num_valid_pages"):
        sparse_topk_select(s, 4, num_valid_pages=33)
    with pytest.raises(ValueError, match="force_begin_blocks"):
        sparse_topk_select(s, 4, force_begin_blocks=3, force_end_blocks=2)
    with pytest.raises(ValueError, match="force_end_blocks"):
        sparse_topk_select(s, 4, force_end_blocks=-1, force_blocks_count_in_topk=False)
    with pytest.raises(TypeError, match="query_positions"):
        sparse_topk_select(s, 4, query_positions=torch.zeros(4, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="query_positions"):
        sparse_topk_select(s, 4, query_positions=torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match="output"):
        sparse_topk_select(s, 4, output=torch.empty(4, 2, 4, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="output"):
        sparse_topk_select(s, 4, force_end_blocks=1, force_blocks_count_in_topk=False,
                           output=torch.empty(4, 2, 4, dtype=torch.int32, device=device))


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_thousand_random_cases_with_ties(random_seed):
    rng = random.Random(random_seed)
    gen = torch.Generator().manual_seed(random_seed)
    cases = 0
    for i in range(1100):
        T = rng.choice([1, 7, 17, 100, 200, 256, 300, 1000, 4097, 12287])  # few chunk widths: few compiles
        tq = rng.randint(1, 64 if T < 2048 else 4)
        H = rng.randint(1, 4)
        s = random_scores(tq, H, T, levels=rng.choice([2, 3, 8, 64, None]), specials=i % 2 == 0, gen=gen,
                          device="cuda")
        topk, kw = random_config(rng, T)
        qpos = torch.randint(-300, T * 128 + 50, (tq,), generator=gen).cuda() if rng.random() < 0.4 else None
        _check_kernel(s, topk, kw, qpos)
        cases += 1
    assert cases >= 1000


@pytest.mark.gpu
def test_gpu_interval_thousand_random_cases_with_ties(random_seed):
    """The interval threshold on >= 1,000 random cases (ties, specials, forced blocks,
    short rows, query positions); few chunk widths and top-k values (few compiles), two
    rows per program at 256 tiles."""
    rng = random.Random(random_seed)
    gen = torch.Generator().manual_seed(random_seed)
    for i in range(1000):
        T = rng.choice([7, 17, 100, 256, 256, 1000])
        tq, H = rng.randint(1, 64), rng.randint(1, 4)
        s = random_scores(tq, H, T, levels=rng.choice([2, 3, 8, 64, None]), specials=i % 2 == 0, gen=gen,
                          device="cuda")
        topk, kw = random_config(rng, T)
        topk = max(topk, 8)
        qpos = torch.randint(-300, T * 128 + 50, (tq,), generator=gen).cuda() if rng.random() < 0.4 else None
        _check_kernel(s, topk, kw, qpos, method="interval", rows_per_program=rng.choice([1, 2]) if T == 256 else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [4097, 12287])
def test_gpu_interval_long_rows_in_registers(T, random_seed):
    """Rows of up to 16,384 tiles held in registers by 16 warps (max_chunk=16384)."""
    gen = torch.Generator().manual_seed(random_seed)
    for levels in (None, 3, 1000):
        s = random_scores(16, 4, T, levels=levels, gen=gen, device="cuda")
        qpos = torch.randint(-300, T * 128 + 50, (16,), generator=gen).cuda()
        for counted in (True, False):
            kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=1,
                      force_blocks_count_in_topk=counted)
            _check_kernel(s, 16, kw, qpos, max_chunk=16384, method="interval")
            _check_kernel(s, 16, kw, None, max_chunk=16384, method="interval")


@pytest.mark.gpu
@pytest.mark.parametrize("T,tq", [(256, 32768), (12287, 64), (8192, 256)])
def test_gpu_large_shapes(T, tq):
    s = torch.randn(tq, 4, T, device="cuda")
    s[:, :, ::7] = 0.5  # ties
    kw = dict(num_valid_pages=None, force_begin_blocks=0, force_end_blocks=1, force_blocks_count_in_topk=False)
    _check_kernel(s, 16, kw, None)
    qpos = torch.randint(0, T * 128, (tq,), device="cuda")
    _check_kernel(s, 16, kw, qpos)


@pytest.mark.gpu
def test_gpu_pipeline_cuda_graph_static_plan():
    """max-score -> top-k captured once with a static plan; replays with new lengths
    written into the same runtime buffers equal eager calls with eager plans."""
    dev = "cuda"
    B, max_q, max_k, H, d = 4, 300, 4000, 4, 128
    cap_q = B * max_q
    tiles = -(-max_k // 128)
    pages = B * tiles + 5
    k = torch.randn(pages, 128, H, d, device=dev).bfloat16()
    q = torch.randn(cap_q, H, d, device=dev).bfloat16()
    info = msa_plan(B, max_q, max_k, H, num_kv_heads=H, page_size=128, output_maxscore=True)
    cu_q = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    cu_k = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    used = torch.zeros(B, dtype=torch.int32, device=dev)
    table = torch.zeros(B, tiles, dtype=torch.int32, device=dev)
    qpos = torch.zeros(cap_q, dtype=torch.int64, device=dev)
    rt = MsaRuntimeMetadata(None, None, None, cu_q, cu_k, page_table=table, seqused_k=used)
    ms = torch.full((cap_q, H, tiles), float("nan"), device=dev)
    sel = torch.empty(cap_q, H, 17, dtype=torch.int32, device=dev)

    def step():
        msa(q, k, None, info, output_o=False, runtime_metadata=rt, max_score=ms)
        sparse_topk_select(ms, 16, output=sel, force_end_blocks=1, force_blocks_count_in_topk=False,
                           query_positions=qpos)

    def write_lengths(q_lens, kv_lens):
        ql, kl = torch.tensor(q_lens), torch.tensor(kv_lens)
        cu_q.copy_(torch.cat([torch.zeros(1), ql.cumsum(0)]).int())
        cu_k.copy_(torch.cat([torch.zeros(1), kl.cumsum(0)]).int())
        used.copy_(kl.int())
        table.copy_(torch.randperm(pages)[: B * tiles].view(B, tiles).int())
        pos = torch.cat([torch.arange(kv - qq, kv) for qq, kv in zip(q_lens, kv_lens)])
        qpos.zero_()
        qpos[: pos.numel()] = pos.to(dev)
        return ql, kl

    write_lengths([1, 2, 3, 4], [100, 200, 300, 400])
    graph = capture_graph(step)
    for q_lens, kv_lens in ([[1, 300, 17, 5], [4000, 3000, 129, 5]], [[300, 300, 300, 300], [300, 1000, 2000, 4000]]):
        ql, kl = write_lengths(q_lens, kv_lens)
        graph.replay()
        torch.cuda.synchronize()
        n = int(ql.sum())
        eager = _msa_plan_from_lengths(ql, kl, H, H, page_size=128, output_maxscore=True, device=dev)
        _, ms_e = msa(q[:n], k, None, eager, output_o=False, page_table=table, max_score=torch.empty(n, H, tiles,
                                                                                                    device=dev))
        sel_e = sparse_topk_select(ms_e, 16, force_end_blocks=1, force_blocks_count_in_topk=False,
                                   query_positions=qpos[:n].clone())
        assert_equal(ms[:n], ms_e)
        assert_equal(sel[:n], sel_e)
