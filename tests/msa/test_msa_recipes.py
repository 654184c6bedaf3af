"""Launch recipes of eager sparse msa() calls (GPU): a plan's third and later calls of one
signature replay the launches its first two made (``mate._core.recipe``). Each replayed call
is checked bit for bit against the same call with recipes off, on fresh inputs every call
(new caches, queries, ids and outputs, as the layers of a model), and the cases that must
not replay (outputs overlapping inputs, misaligned tensors) still get the ordinary path's
checks and results."""

from __future__ import annotations

import pytest
import torch

from mate._core import recipe as R
from mate.msa_interface import _msa_plan_from_lengths, msa, msa_plan
from mate.ops.msa.plan import MsaRuntimeMetadata
from mate.testing import poisoned
from mate.testing.graphs import capture_graph

pytestmark = pytest.mark.gpu

HQ, HKV, TOPK = 64, 4, 16

CASES = {
    "decode": dict(q_lens=[1] * 24, kv_lens=[8192] * 24),
    "decode split": dict(q_lens=[1] * 3, kv_lens=[20000, 9000, 4097]),
    "decode fp8 head-major": dict(q_lens=[1] * 24, kv_lens=[8192] * 24, dtype=torch.float8_e4m3fn, head_major=True),
    "prefill": dict(q_lens=[300], kv_lens=[4000]),
    "mixed": dict(q_lens=[1, 1, 200], kv_lens=[3000, 700, 2000]),
    "kv_indices, no lse, no out": dict(q_lens=[1] * 8, kv_lens=[5000] * 8, flat_pages=True, lse=False, out=False),
}


def _inputs(case: dict, generator: torch.Generator):
    dev = "cuda"
    q_lens, kv_lens = case["q_lens"], case["kv_lens"]
    width = max(-(-n // 128) for n in kv_lens)
    pages = len(q_lens) * width + 3
    dtype = case.get("dtype", torch.bfloat16)
    shape = (pages, HKV, 128, 128) if case.get("head_major") else (pages, 128, HKV, 128)
    k = torch.randn(shape, generator=generator).to(dev, dtype)
    v = torch.randn(shape, generator=generator).to(dev, dtype)
    total = sum(q_lens)
    q = (torch.randn(total, HQ, 128, generator=generator) * 0.5).to(dev, dtype)
    idx = torch.randint(-1, width + 2, (total, HKV, TOPK), generator=generator, dtype=torch.int32)
    perm = torch.randperm(pages, generator=generator).to(torch.int32)
    table = perm[:len(q_lens) * width].view(len(q_lens), width).contiguous()
    return q, k, v, idx.to(dev), table.to(dev)


def _call(info, q, k, v, idx, table, case, *, out=None, lse=None):
    kw = {}
    if case.get("flat_pages"):
        kw["kv_indices"] = table.flatten()
    else:
        kw["page_table"] = table
    if lse is not None:
        kw["lse"] = lse
    return msa(q, k, v, info, kv_block_indexes=idx, out=out, **kw)


def _warm(info, case, g):
    """One ordinary call: the kernels' first launches in the process compile them, and a call
    that compiles is not recorded."""
    with R.disabled():
        q, k, v, idx, table = _inputs(case, g)
        _call(info, q, k, v, idx, table, case)


@pytest.mark.parametrize("name", list(CASES))
def test_replayed_calls_equal_the_ordinary_path(name):
    case = CASES[name]
    dev = "cuda"
    info = _msa_plan_from_lengths(torch.tensor(case["q_lens"]), torch.tensor(case["kv_lens"]), HQ, num_kv_heads=HKV,
                                  page_size=128, kv_block_num=TOPK, force_end_blocks=1, device=dev)
    if case.get("flat_pages"):  # request i's pages are row i of the table, flattened
        width = max(-(-n // 128) for n in case["kv_lens"])
        info = _msa_plan_from_lengths(torch.tensor(case["q_lens"]), torch.tensor([width * 128] * len(case["q_lens"])),
                                      HQ, num_kv_heads=HKV, page_size=128, kv_block_num=TOPK, force_end_blocks=1,
                                      device=dev)
    cache = info.plan.workspace.recipes
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    out_dtype = torch.bfloat16
    _warm(info, case, g)
    for call in range(5):
        q, k, v, idx, table = _inputs(case, g)
        total = q.shape[0]
        with_out = case.get("out", True)
        out = poisoned((total, HQ, 128), out_dtype, dev) if with_out else None
        lse = poisoned((total, HQ), torch.float32, dev) if case.get("lse", True) else None
        before = cache.replays
        o, _ = _call(info, q, k, v, idx, table, case, out=out, lse=lse)
        assert (cache.replays > before) == (call >= 2), f"call {call}: replays {cache.replays}"
        want_out = poisoned((total, HQ, 128), out_dtype, dev)
        want_lse = poisoned((total, HQ), torch.float32, dev) if lse is not None else None
        with R.disabled():  # the same call the ordinary way
            _call(info, q, k, v, idx, table, case, out=want_out, lse=want_lse)
        torch.cuda.synchronize()
        assert not o.isnan().any(), f"call {call}: unwritten output"
        assert torch.equal(o, want_out), f"call {call}: output differs from the ordinary path"
        if lse is not None:
            assert torch.equal(lse.nan_to_num(), want_lse.nan_to_num()), f"call {call}: lse differs"


def test_replay_keeps_the_address_checks():
    case = CASES["decode"]
    dev = "cuda"
    info = _msa_plan_from_lengths(torch.tensor(case["q_lens"]), torch.tensor(case["kv_lens"]), HQ, num_kv_heads=HKV,
                                  page_size=128, kv_block_num=TOPK, force_end_blocks=1, device=dev)
    cache = info.plan.workspace.recipes
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    _warm(info, case, g)
    for _ in range(3):
        q, k, v, idx, table = _inputs(case, g)
        _call(info, q, k, v, idx, table, case, out=torch.empty_like(q))
    assert cache.replays == 1
    q, k, v, idx, table = _inputs(case, g)
    with pytest.raises(ValueError, match="out must not overlap q"):
        _call(info, q, k, v, idx, table, case, out=q)
    # a cache 2 bytes off 16-byte alignment: the ordinary path's TMA check, not a replay
    base = torch.empty(k.numel() + 8, dtype=k.dtype, device=dev)
    k_off = base[1:1 + k.numel()].view(k.shape)
    k_off.copy_(k)
    with pytest.raises(ValueError, match="16-byte aligned"):
        _call(info, q, k_off, v, idx, table, case, out=torch.empty_like(q))
    # a query view off 16-byte alignment takes the ordinary path and gives its result
    qb = torch.empty(q.numel() + 8, dtype=q.dtype, device=dev)
    q_off = qb[1:1 + q.numel()].view(q.shape)
    q_off.copy_(q)
    replays = cache.replays
    o1, _ = _call(info, q_off, k, v, idx, table, case, out=torch.empty_like(q))
    o2, _ = _call(info, q, k, v, idx, table, case, out=torch.empty_like(q))
    assert cache.replays == replays + 1  # only the aligned call replayed
    torch.cuda.synchronize()
    assert torch.equal(o1, o2)


def test_replay_under_cuda_graph_capture():
    """A static plan's calls replayed inside capture: the graph replays with new lengths equal
    the ordinary eager calls."""
    dev = "cuda"
    bmax, max_k = 8, 4096
    info = msa_plan(bmax, 1, max_k, HQ, total_seqlen_k=bmax * max_k, num_kv_heads=HKV, page_size=128,
                    kv_block_num=TOPK, force_end_blocks=1, sparse_kernel_mode="decode")
    pages = bmax * max_k // 128
    k = torch.randn(pages, 128, HKV, 128, device=dev).to(torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(bmax, HQ, 128, device=dev).to(torch.bfloat16)
    idx = torch.randint(-1, max_k // 128, (bmax, HKV, TOPK), device=dev, dtype=torch.int32)
    cu_q = torch.arange(bmax + 1, dtype=torch.int32, device=dev)
    cu_k = torch.zeros(bmax + 1, dtype=torch.int32, device=dev)
    used = torch.zeros(bmax, dtype=torch.int32, device=dev)
    table = torch.randperm(pages, device=dev).to(torch.int32).view(bmax, -1).contiguous()
    rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used, page_table=table)
    out = torch.zeros(bmax, HQ, 128, device=dev, dtype=torch.bfloat16)
    lse = torch.zeros(bmax, HQ, device=dev)

    def step(o=out, l_=lse):
        msa(q, k, v, info, kv_block_indexes=idx, runtime_metadata=rt, page_table=table, out=o, lse=l_)

    def set_lengths(kv_lens):
        used.copy_(torch.tensor(kv_lens, dtype=torch.int32))
        cu_k.copy_(torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32))

    set_lengths([max_k] * bmax)
    with R.disabled():
        step()  # compiles the kernels (a call that compiles is not recorded)
    step()
    cache = info.plan.workspace.recipes
    graph = capture_graph(step)  # its eager call is the second recording; the captured one replays
    assert cache.replays == 1
    for kv_lens in ([4096, 1, 129, 3000, 0, 2048, 128, 77], [17, 4096, 4095, 256, 1000, 1, 2, 3]):
        set_lengths(kv_lens)
        out.fill_(float("nan"))
        graph.replay()
        want_o = poisoned(out.shape, out.dtype, dev)
        want_l = poisoned(lse.shape, lse.dtype, dev)
        with R.disabled():
            step(want_o, want_l)
        torch.cuda.synchronize()
        assert torch.equal(out, want_o) and torch.equal(lse.nan_to_num(), want_l.nan_to_num())


@pytest.mark.parametrize("paged", [True, False])
def test_replayed_max_score_passes_equal_the_ordinary_path(paged):
    """The max-score pass alone into a given buffer (output_o=False), paged or dense keys."""
    dev = "cuda"
    q_lens, kv_lens = [1, 1, 700], [9000, 130, 4000]
    pages_per = [-(-n // 128) for n in kv_lens]
    info = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), HKV, num_kv_heads=HKV,
                                  page_size=128 if paged else 0, output_maxscore=True, split_prefill_decode=False,
                                  device=dev)
    cache = info.plan.workspace.recipes
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    tiles = info.plan.max_k_tiles

    def inputs():
        q = torch.randn(sum(q_lens), HKV, 128, generator=g).to(dev, torch.bfloat16)
        kw = {}
        if paged:
            pages = 3 * max(pages_per) + 2
            k = torch.randn(pages, 128, HKV, 128, generator=g).to(dev, torch.bfloat16)
            kw["page_table"] = torch.randperm(pages, generator=g)[:3 * max(pages_per)].to(torch.int32).view(
                3, -1).to(dev)
        else:
            k = torch.randn(sum(kv_lens), HKV, 128, generator=g).to(dev, torch.bfloat16)
        return q, k, kw

    def run(q, k, kw):
        ms = poisoned((q.shape[0], HKV, tiles), torch.float32, dev)
        out, scores = msa(q, k, None, info, max_score=ms, output_o=False, **kw)
        assert out is None and scores is ms
        return ms

    _replays_equal_the_ordinary_path(lambda: cache.replays, inputs, run,
                                     lambda got, want: torch.equal(got.nan_to_num(), want.nan_to_num()))


@pytest.mark.parametrize("given_output,tiles", [(True, 256), (False, 64), (True, 1024)])
def test_replayed_topk_selections_equal_the_ordinary_path(given_output, tiles):
    """sparse_topk_select: from the third call of a signature its launches replay (the lanes
    Gluon kernel at up to 256 tiles, the interval kernel past them), bit for bit the ordinary
    path's selection on fresh scores every call."""
    from mate.msa_interface import _TOPK_RECIPES, sparse_topk_select

    dev = "cuda"
    g = torch.Generator().manual_seed(torch.seed() % 2**31)

    def inputs():
        scores = torch.randn(300, HKV, tiles, generator=g).mul(4).round().to(dev)  # many ties
        pos = (torch.randint(0, tiles * 128, (300,), generator=g)).to(dev)
        return scores, pos

    def run(scores, pos):
        out = poisoned((300, HKV, TOPK), torch.int32, dev) if given_output else None
        res = sparse_topk_select(scores, TOPK, output=out, force_end_blocks=1, query_positions=pos)
        assert res.shape == (300, HKV, TOPK) and (res is out or not given_output)
        return res

    _replays_equal_the_ordinary_path(lambda: _TOPK_RECIPES.replays, inputs, run, torch.equal)


def _replays_equal_the_ordinary_path(replays, inputs, run, same, calls: int = 5) -> None:
    """After a first call that compiles (recipes off), ``calls`` calls of ``run`` on fresh
    ``inputs()``: from the third on each one replays (``replays()`` grows), and each result
    equals (``same``) the same call run the ordinary way."""
    with R.disabled():
        run(*inputs())
    for call in range(calls):
        args = inputs()
        before = replays()
        got = run(*args)
        assert (replays() > before) == (call >= 2), f"call {call}"
        with R.disabled():
            want = run(*args)
        torch.cuda.synchronize()
        assert same(got, want), f"call {call}: result differs from the ordinary path"
