"""Launch recipes of eager ``flash_attn_varlen_func`` calls (GPU): repeated calls of one
signature replay the launches the first ones recorded (``mate._core.recipe``). Every replayed
call is checked bit for bit against the same call with recipes off, on fresh tensors each
call; a single dense sequence (torch's SDPA) never replays."""

from __future__ import annotations

import pytest
import torch

from mate import mha_interface as M
from mate._core import recipe as R
from mate.testing import poisoned

pytestmark = pytest.mark.gpu

CASES = {
    "ragged causal, lse": dict(q_lens=[100, 7000, 64, 1, 333], causal=True, lse=True),
    "decode rows and a chunk": dict(q_lens=[1] * 30 + [2048], k_extra=4096, causal=True),
    "paged, out given": dict(q_lens=[300, 1, 65], k_extra=1000, paged=True, out=True),
}


def _inputs(case, g):
    dev = "cuda"
    q_lens = case["q_lens"]
    k_lens = [n + case.get("k_extra", 0) for n in q_lens]
    hq, hkv, d = 32, 8, 128
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(dev, torch.bfloat16)
    kw = dict(cu_seqlens_q=cu_q, max_seqlen_q=max(q_lens), causal=case.get("causal", False),
              return_softmax_lse=case.get("lse", False))
    if case.get("paged"):
        pages_per = [-(-n // 64) for n in k_lens]
        pages = sum(pages_per) + 2
        k = torch.randn(pages, 64, hkv, d, generator=g).to(dev, torch.bfloat16)
        v = torch.randn(pages, 64, hkv, d, generator=g).to(dev, torch.bfloat16)
        perm = torch.randperm(pages, generator=g).to(torch.int32)
        table = torch.zeros(len(q_lens), max(pages_per), dtype=torch.int32)
        p = 0
        for i, n in enumerate(pages_per):
            table[i, :n] = perm[p:p + n]
            p += n
        kw.update(page_table=table.to(dev), seqused_k=torch.tensor(k_lens, dtype=torch.int32, device=dev))
    else:
        cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        k = torch.randn(sum(k_lens), hkv, d, generator=g).to(dev, torch.bfloat16)
        v = torch.randn(sum(k_lens), hkv, d, generator=g).to(dev, torch.bfloat16)
        kw.update(cu_seqlens_k=cu_k, max_seqlen_k=max(k_lens))
    return q, k, v, kw


def _ordinary(q, k, v, kw):
    with R.disabled():
        return M.flash_attn_varlen_func(q, k, v, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_replayed_calls_equal_the_ordinary_path(name):
    case = CASES[name]
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q, k, v, kw = _inputs(case, g)
    _ordinary(q, k, v, kw)  # compiles (a call that compiles is not recorded)
    for call in range(5):
        q, k, v, kw = _inputs(case, g)
        if case.get("out"):
            kw["out"] = poisoned(q.shape, q.dtype, "cuda")
        before = M._VARLEN_RECIPES.replays
        got = M.flash_attn_varlen_func(q, k, v, **kw)
        assert (M._VARLEN_RECIPES.replays > before) == (call >= 2), f"call {call}"
        if case.get("out"):
            kw["out"] = poisoned(q.shape, q.dtype, "cuda")
        want = _ordinary(q, k, v, kw)
        torch.cuda.synchronize()
        got, want = (got, want) if case.get("lse") else ((got,), (want,))
        for a, b in zip(got, want):
            assert not a.isnan().any() and torch.equal(a, b), f"call {call}: differs from the ordinary path"


def test_single_sequence_never_replays():
    g = torch.Generator().manual_seed(0)
    case = dict(q_lens=[512], causal=True)
    before = M._VARLEN_RECIPES.replays
    for _ in range(4):
        q, k, v, kw = _inputs(case, g)
        got = M.flash_attn_varlen_func(q, k, v, **kw)
        want = _ordinary(q, k, v, kw)
        torch.cuda.synchronize()
        assert torch.equal(got, want)
    assert M._VARLEN_RECIPES.replays == before


@pytest.mark.parametrize("paged", [True, False])
def test_replayed_kvcache_calls_equal_the_ordinary_path(paged):
    """flash_attn_with_kvcache decode steps (batched q [B, 1, Hq, D]; the batched LSE comes back
    as [B, Hq, 1] through a copy after the launches, in both paths)."""
    dev = "cuda"
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b, hq, hkv, d = 48, 32, 8, 128
    lens = torch.randint(1, 3000, (b,), generator=g, dtype=torch.int32).to(dev)

    def inputs():
        q = torch.randn(b, 1, hq, d, generator=g).to(dev, torch.bfloat16)
        if paged:
            k = torch.randn(b * 24, 128, hkv, d, generator=g).to(dev, torch.bfloat16)
            kw = dict(page_table=torch.randperm(b * 24, generator=g).to(torch.int32).view(b, 24).to(dev))
        else:
            k = torch.randn(b, 3000, hkv, d, generator=g).to(dev, torch.bfloat16)
            kw = {}
        return q, k, torch.randn(k.shape, generator=g).to(dev, torch.bfloat16), kw

    def run(q, k, v, kw):
        return M.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, return_softmax_lse=True, **kw)

    with R.disabled():
        run(*inputs())  # compiles
    for call in range(5):
        args = inputs()
        before = M._KVCACHE_RECIPES.replays
        got = run(*args)
        assert (M._KVCACHE_RECIPES.replays > before) == (call >= 2), f"call {call}"
        with R.disabled():
            want = run(*args)
        torch.cuda.synchronize()
        for a, w in zip(got, want):
            assert torch.equal(a, w), f"call {call}: differs from the ordinary path"
