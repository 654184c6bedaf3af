"""Launch recipes of eager sparse_mla_fp8_decode calls (GPU): the third and later calls of one
signature with one metadata object replay the launches of the first two
(``mate._core.recipe``), bit for bit what the ordinary path computes, on fresh inputs every
call (new queries, caches, indices and outputs, as the layers of a step), for each kernel the
plans choose (the Gluon 64-head kernel unsplit and split with its combine, the small-H Gluon
kernels, the plain-Triton kernel) and each way of asking for outputs."""

from __future__ import annotations

import pytest
import torch

from mate._core import recipe as R
from mate.ops.sparse_mla.metadata import plan_decode
from mate.sparse_mla_interface import _DECODE_RECIPES, sparse_mla_fp8_decode
from mate.testing import poisoned
from mate.testing.graphs import capture_graph

pytestmark = pytest.mark.gpu

TOP_K = 2048

CASES = {  # (B, q_len, H, plan options, outputs: "none" / "out" / "out+lse2d" / "return_lse")
    "gluon 128 heads": (8, 1, 128, {}, "out"),
    "gluon 128 heads, split": (2, 1, 128, {"num_splits": 4, "gluon": True}, "return_lse"),
    "small-H gluon, 32 heads": (16, 1, 32, {}, "none"),
    "small-H one warpgroup, 16 heads, q_len 2": (4, 2, 16, {}, "out+lse2d"),
    "plain Triton, 64 heads": (4, 1, 64, {"gluon": False}, "return_lse"),
}


def _inputs(B, q_len, H, g):
    dev = "cuda"
    pages = B * TOP_K // 64 + 3
    q = torch.randn(B, q_len, H, 576, generator=g).to(dev, torch.float8_e4m3fn)
    kv = torch.randn(pages, 64, 576, generator=g).to(dev, torch.float8_e4m3fn)
    bt = torch.randint(-1, pages * 64 + 5, (B, q_len, TOP_K), generator=g, dtype=torch.int32).to(dev)
    sl = torch.randint(1, TOP_K + 1, (B,), generator=g, dtype=torch.int32).to(dev)
    return q, kv, bt, sl


def _call(meta, q, kv, bt, sl, mode, out=None, lse=None):
    res = sparse_mla_fp8_decode(q, kv, None, 128, 512, 64, bt, sl, 4 * TOP_K, sparse_mla_top_k=TOP_K,
                                bmm1_scale=576 ** -0.5, out=out, lse=lse, return_lse=mode == "return_lse",
                                metadata=meta)
    return res if isinstance(res, tuple) else (res, lse)


def _outputs(B, q_len, H, mode):
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda") if mode != "none" else None
    lse = poisoned((B * q_len, H), torch.float32, "cuda") if mode == "out+lse2d" else None
    return out, lse


@pytest.mark.parametrize("name", list(CASES))
def test_replayed_decodes_equal_the_ordinary_path(name):
    B, q_len, H, opts, mode = CASES[name]
    meta = plan_decode(B, q_len, H, TOP_K, "cuda", **opts)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    with R.disabled():  # compiles (a call that compiles is not recorded)
        _call(meta, *_inputs(B, q_len, H, g), mode)
    for call in range(5):
        q, kv, bt, sl = _inputs(B, q_len, H, g)
        out, lse = _outputs(B, q_len, H, mode)
        cache = _DECODE_RECIPES.get(meta)
        before = cache.replays if cache is not None else 0
        o, l_ = _call(meta, q, kv, bt, sl, mode, out, lse)
        assert (_DECODE_RECIPES[meta].replays > before) == (call >= 2), f"call {call}"
        want_o, want_l = _outputs(B, q_len, H, "out+lse2d")
        with R.disabled():
            _call(meta, q, kv, bt, sl, "out+lse2d", want_o, want_l)
        torch.cuda.synchronize()
        assert not o.isnan().any(), f"call {call}: unwritten output"
        assert torch.equal(o, want_o), f"call {call}: output differs from the ordinary path"
        if l_ is not None:
            assert torch.equal(l_.reshape(want_l.shape), want_l), f"call {call}: lse differs"


def test_replay_keeps_the_overlap_check_and_replays_under_capture():
    B, q_len, H = 4, 1, 128
    meta = plan_decode(B, q_len, H, TOP_K, "cuda")
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q, kv, bt, sl = _inputs(B, q_len, H, g)
    out = torch.empty(B, q_len, H, 512, dtype=torch.bfloat16, device="cuda")
    with R.disabled():
        _call(meta, q, kv, bt, sl, "out", out)
    for _ in range(3):
        _call(meta, q, kv, bt, sl, "out", out)
    assert _DECODE_RECIPES[meta].replays == 1
    alias = kv.view(torch.uint8).view(-1)[:out.numel() * 2].view(torch.bfloat16).view(out.shape)
    with pytest.raises(ValueError, match="out must not overlap"):
        _call(meta, q, kv, bt, sl, "out", alias)
    graph = capture_graph(lambda: _call(meta, q, kv, bt, sl, "out", out))
    _assert_replay_with_new_inputs(graph, meta, (q, kv, bt, sl), out, g)


def _assert_replay_with_new_inputs(graph, meta, inputs, out, g):
    """New inputs written in place, the graph replayed: ``out`` equals the ordinary path's."""
    for t, new in zip(inputs, _inputs(*out.shape[:3], g)):
        t.copy_(new)
    out.fill_(float("nan"))
    graph.replay()
    want = poisoned(out.shape, out.dtype, "cuda")
    with R.disabled():
        _call(meta, *inputs, "out", want)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_calls_without_metadata_keep_a_plan_per_stream(monkeypatch):
    """Eager calls without metadata share one kept plan per shape and stream, replay its recipes
    bit for bit as the ordinary path computes, get another plan on another stream, and plan for
    themselves under capture (the captured call still right after new inputs)."""
    import collections

    import mate.sparse_mla_interface as S

    monkeypatch.setattr(S, "_IMPLICIT_PLANS", collections.OrderedDict())
    B, q_len, H = 4, 1, 128
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    with R.disabled():
        _call(None, *_inputs(B, q_len, H, g), "out", poisoned((B, q_len, H, 512), torch.bfloat16, "cuda"))
    assert not S._IMPLICIT_PLANS
    for call in range(5):
        q, kv, bt, sl = _inputs(B, q_len, H, g)
        o, _ = _call(None, q, kv, bt, sl, "none")
        want = poisoned(o.shape, o.dtype, "cuda")
        with R.disabled():
            _call(None, q, kv, bt, sl, "out", want)
        torch.cuda.synchronize()
        assert torch.equal(o, want), f"call {call}: output differs from the ordinary path"
    (kept,) = S._IMPLICIT_PLANS.values()
    assert _DECODE_RECIPES[kept].replays == 2  # calls 3 and 4 (the first kept the plan)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o_side, _ = _call(None, q, kv, bt, sl, "none")
    torch.cuda.current_stream().wait_stream(side)
    assert len(S._IMPLICIT_PLANS) == 2 and torch.equal(o_side, want)
    out = poisoned((B, q_len, H, 512), torch.bfloat16, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # compiled and warm already
        _call(None, q, kv, bt, sl, "out", out)
    assert len(S._IMPLICIT_PLANS) == 2
    _assert_replay_with_new_inputs(graph, None, (q, kv, bt, sl), out, g)
