"""``mate._core.recipe``: launch recipes recorded from stand-in kernels on CPU tensors.

The GPU suite (``tests/msa/test_msa_recipes.py``) replays real ``msa()`` calls against the
ordinary path; here the bookkeeping is checked: which addresses a recipe attributes to which
tensor, what it keeps, what it refuses to build or replay, and when the cache trusts it.
"""

from __future__ import annotations

import collections
import weakref

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from mate._core import launch as L
from mate._core import recipe as R
from tests.core._fake_triton import FakeJIT


def _warm(fake):
    """A FastLaunch of ``fake`` whose specializations of the op below are compiled."""
    fast = L.launcher(fake)
    _op(fast, *_inputs(), torch.zeros(16))
    return fast


def _inputs(rows: int = 8):
    q = torch.randn(rows, 4)
    k = torch.randn(32, 4)
    out = torch.empty(rows, 4)
    return q, k, out


WORKSPACE = torch.zeros(64)


def _op(fast, q, k, out, temp):
    """Two launches: a row slice of q, k through a descriptor, a workspace slice, scalars."""
    desc = TensorDescriptor(k, list(k.shape), list(k.stride()), [16, 4])
    fast[(2, 3)](q[4:], desc, WORKSPACE[16:], out, 7, 0.5, BLOCK=16)
    fast[(1,)](out, temp, q.shape[0], BLOCK=32)


def _record(fast, tensors, temp=None):
    with L.recording() as rec:
        _op(fast, *tensors, torch.zeros(16) if temp is None else temp)
    return rec


def test_recording_keeps_cached_launches_and_flags_first_ones(fake):
    fast = L.launcher(fake)
    rec = _record(fast, _inputs())
    assert not rec.complete and rec.launches == []  # first launches (compilations): JITFunction's path
    rec = _record(fast, _inputs())
    assert rec.complete and len(rec.launches) == 2 and rec.device == 0
    kernel, grid, values = rec.launches[0]
    assert kernel in fast.cache.values() and grid == (2, 3, 1) and values[4:6] == (7, 0.5)
    assert L.active_recording() is None


def test_replay_substitutes_addresses_and_keeps_workspace(fake):
    fast = _warm(fake)
    tensors = _inputs()
    temp = torch.zeros(16)
    recipe = R.LaunchRecipe.build(_record(fast, tensors, temp), tensors)
    assert recipe is not None
    assert any(t is temp for t in recipe.kept)  # not among the call's tensors: kept alive
    q2, k2, out2 = _inputs()
    calls = [len(c.calls) for c in fake.compiled]
    assert recipe.replay([q2, k2, out2])
    new = [c.calls[-1] for c, n in zip(fake.compiled, calls) if len(c.calls) > n]
    first, second = sorted(new, key=lambda call: -call[0])  # grids (2, 3) and (1,)
    assert first[:4] == (2, 3, 1, 1234)
    args = first[9:]
    assert args[0] == q2.data_ptr() + 4 * q2.stride(0) * 4
    assert args[1].base.data_ptr() == k2.data_ptr() and list(args[1].block_shape) == [16, 4]
    assert args[2] == WORKSPACE.data_ptr() + 16 * 4 and args[3] == out2.data_ptr()
    assert args[4:] == (7, 0.5, 16)
    assert second[9:] == (out2.data_ptr(), temp.data_ptr(), 8, 32)


def test_recipe_keeps_none_of_the_recorded_call_tensors(fake):
    import gc
    import weakref

    fast = _warm(fake)
    tensors = _inputs()
    recipe = R.LaunchRecipe.build(_record(fast, tensors), tensors)
    refs = [weakref.ref(t) for t in tensors]
    for compiled in fake.compiled:  # the stand-in's own log of launch arguments
        compiled.calls.clear()
    del tensors
    gc.collect()
    assert recipe is not None and all(r() is None for r in refs)


def test_second_call_is_predicted_unless_it_used_a_temporary(fake):
    fast = _warm(fake)
    tensors = _inputs()
    keep = torch.zeros(16)
    recipe = R.LaunchRecipe.build(_record(fast, tensors, keep), tensors)
    again = _inputs()
    assert recipe.predicts(_record(fast, again, keep), again)
    assert not recipe.predicts(_record(fast, again), again)  # a fresh temporary: not a function of the inputs
    longer = _inputs(rows=16)
    assert not recipe.predicts(_record(fast, longer, keep), longer)  # another scalar (rows)


def test_ambiguous_and_tied_addresses(fake):
    fast = _warm(fake)
    q, k, out = _inputs()
    big = torch.randn(64, 4)
    # q's slice q[4:] starts inside two tensors neither of which starts there: no recipe
    rec = _record(fast, (big[:8], k, out))
    assert R.LaunchRecipe.build(rec, [big[:8], k, out, big[2:10]]) is None
    # the same memory under two names: replayed only while they still share it
    q2 = q.view(8, 4)
    recipe = R.LaunchRecipe.build(_record(fast, (q, k, out)), [q, k, out, q2])
    assert recipe is not None and recipe.relations
    assert recipe.replay([q, k, out, q2])
    assert not recipe.replay([q, k, out, torch.randn(8, 4)])


def test_replay_declines_misalignment_overlap_and_hooks(fake):
    fast = _warm(fake)
    tensors = _inputs()
    recipe = R.LaunchRecipe.build(_record(fast, tensors), tensors)
    base = torch.randn(8 * 4 + 1)
    assert not recipe.replay([base[1:].view(8, 4), *_inputs()[1:]])  # q off its 16-byte alignment
    q, k, out = _inputs()
    assert recipe.replay([q, k, out], outputs=(2,))
    assert not recipe.replay([q, k, q], outputs=(2,))  # out is q
    from triton import knobs

    knobs.runtime.launch_enter_hook.add(print)
    try:
        assert not recipe.replay([q, k, out])
    finally:
        knobs.runtime.launch_enter_hook.remove(print)


def test_cache_trusts_after_a_predicted_second_call(fake):
    fast = _warm(fake)
    cache = R.RecipeCache(limit=2)
    keep = torch.zeros(16)

    def call(key, temp=keep):
        tensors = _inputs()
        if cache.replay(key, tensors):
            return "replayed"
        assert cache.wants(key)
        with L.recording() as rec:
            _op(fast, *tensors, temp)
        cache.observe(key, rec, tensors)
        return "recorded"

    assert [call("a") for _ in range(4)] == ["recorded", "recorded", "replayed", "replayed"]
    assert cache.replays == 2 and cache.trusted("a")
    # a temporary per call: never predicted, given up after MISSES recordings
    for _ in range(R.RecipeCache.MISSES + 1):
        call("b", torch.zeros(16))
    assert not cache.trusted("b") and not cache.wants("b")
    # past the limit the least recently used key goes ("a": "b" was recorded since its last replay)
    assert [call("c") for _ in range(3)] == ["recorded", "recorded", "replayed"]
    assert len(cache) == 2 and not cache.trusted("a") and cache.wants("a")
    assert call("a") == "recorded"


def test_signature():
    t = torch.zeros(2, 3)
    assert R.signature(t) == (torch.Size([2, 3]), (3, 1), torch.float32, torch.device("cpu"))
    assert R.signature(True) != R.signature(1) and R.signature(1) != R.signature(1.0)
    assert R.signature((t, None)) == R.signature((torch.ones(2, 3), None))
    with pytest.raises(TypeError, match="no recipe signature"):
        R.signature(object())
    a = object()
    assert R.Identity(a) == R.Identity(a) and R.Identity(a) != R.Identity(object())
    assert hash(R.Identity(a)) == id(a)


def test_recipes_need_cuda_and_the_fast_path(fake, monkeypatch):
    assert not R.recipes_usable(torch.zeros(1))  # a CPU tensor
    cuda_like = type("T", (), {"is_cuda": True})()
    assert R.recipes_usable(cuda_like)
    with L.recording():
        assert not R.recipes_usable(cuda_like)  # inside another call's recording
    monkeypatch.setenv("MATE_CHECK_INPUTS", "1")  # value checks that read inputs: never skipped
    assert not R.recipes_usable(cuda_like)
    monkeypatch.delenv("MATE_CHECK_INPUTS")
    assert R.recipes_usable(cuda_like)
    monkeypatch.setattr(R, "RECIPES", False)
    assert not R.recipes_usable(cuda_like)


# ---------------------------------------------------------------- msa() and flash_attn_varlen_func
# Their recipe glue on CPU tensors, with stand-in kernels on the fast launch path: after a call that
# compiles, the third call of a signature replays, and a replay launches exactly what the ordinary
# path launches for the same tensors.


_LAUNCHES: list = []


def _same_launches(replayed, ordinary, tensors) -> bool:
    """Whether two lists of stand-in launches agree: equal values, and pointers (ints from a
    replay, tensors from an ordinary call) at the same offset of the same call tensor, or both
    outside every call tensor (a workspace, an LSE allocated per call)."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]

    def where(p):
        return next(((i, p - lo) for i, (lo, hi) in enumerate(spans) if lo <= p < hi), "outside")

    def same(a, b):
        if isinstance(b, torch.Tensor):
            return isinstance(a, (int, torch.Tensor)) and where(R._address(a)) == where(b.data_ptr())
        if R._is_descriptor(b):
            return R._is_descriptor(a) and where(a.base.data_ptr()) == where(b.base.data_ptr()) and (
                list(a.block_shape) == list(b.block_shape))
        return type(a) is type(b) and a == b

    return len(replayed) == len(ordinary) and all(
        len(x) == len(y) and all(same(a, b) for a, b in zip(x, y)) for x, y in zip(replayed, ordinary))


@pytest.fixture
def stand_in_gpu(fake, monkeypatch):
    """CPU tensors taken for an eager GPU call: recipes usable, the Triton backend, a device;
    stand-in launches logged in order."""
    from tests.core._fake_triton import FakeCompiled

    _LAUNCHES.clear()
    monkeypatch.setattr(FakeCompiled, "run", lambda self, *args: _LAUNCHES.append(args))
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    import mate.mha_interface as M
    import mate.msa_interface as MI

    usable = lambda t: R.RECIPES and L.active_recording() is None  # noqa: E731
    monkeypatch.setattr(MI, "recipes_usable", usable)
    monkeypatch.setattr(M, "recipes_usable", usable)
    monkeypatch.setattr(M, "select_backend", lambda device, override=None: "triton")
    monkeypatch.setattr(MI, "select_backend", lambda device, override=None: "triton")
    monkeypatch.setattr("mate._core.dispatch.select_backend", lambda device, override=None: "triton")
    return _LAUNCHES


def _replays_match(call, cache, calls=5):
    with R.disabled():
        call()  # compiles (JITFunction's path; a call that compiles is not recorded)
    for i in range(calls):
        before, n = cache.replays, len(_LAUNCHES)
        tensors = call()
        assert (cache.replays > before) == (i >= 2), f"call {i}"
        mine = _LAUNCHES[n:]
        with R.disabled():
            call(tensors)
        assert mine and _same_launches(mine, _LAUNCHES[n + len(mine):], tensors), f"call {i}: launches differ"


def test_msa_sparse_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch):
    import mate.ops.msa.sparse_attention as SA
    import mate.ops.msa.sparse_decode as SD
    from mate.msa_interface import _msa_plan_from_lengths, msa

    fakes = [FakeJIT(), FakeJIT()]
    monkeypatch.setattr(SD, "msa_decode_t_kernel", fakes[0])
    monkeypatch.setattr(SA, "_msa_combine_kernel", fakes[1])
    info = _msa_plan_from_lengths(torch.tensor([1, 1, 1]), torch.tensor([9000, 300, 5000]), 16, num_kv_heads=2,
                                  page_size=128, kv_block_num=8)

    def call(tensors=None):
        if tensors is None:
            k = torch.randn(220, 128, 2, 128, dtype=torch.bfloat16)
            tensors = (torch.randn(3, 16, 128, dtype=torch.bfloat16), k, torch.randn_like(k),
                       torch.randint(-1, 80, (3, 2, 8), dtype=torch.int32),
                       torch.randperm(220)[:3 * 71].to(torch.int32).view(3, 71), torch.empty(3, 16, 128,
                                                                                            dtype=torch.bfloat16))
        q, k, v, idx, table, out = tensors
        msa(q, k, v, info, kv_block_indexes=idx, page_table=table, out=out)
        return tensors

    _replays_match(call, info.plan.workspace.recipes)


def test_varlen_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch):
    import mate.mha_interface as M
    import mate.ops.mha.attention as A
    import mate.ops.mha.prefill_tma as P

    fakes = [FakeJIT(), FakeJIT()]
    monkeypatch.setattr(A, "_mha_fwd_kernel", fakes[0])
    monkeypatch.setattr(P, "_mha_prefill_tma_kernel", fakes[1])
    monkeypatch.setattr(M, "_VARLEN_RECIPES", R.RecipeCache())
    cu = torch.tensor([0, 1, 200, 328], dtype=torch.int32)

    def call(tensors=None):
        if tensors is None:
            k = torch.randn(328, 4, 64, dtype=torch.float16)
            tensors = (torch.randn(328, 8, 64, dtype=torch.float16), k, torch.randn_like(k))
        M.flash_attn_varlen_func(*tensors, cu, cu, 199, 199, causal=True, return_softmax_lse=True)
        return tensors

    _replays_match(call, M._VARLEN_RECIPES)


def test_msa_max_score_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch):
    import mate.ops.msa.maxscore as MS
    from mate.msa_interface import _msa_plan_from_lengths, msa

    monkeypatch.setattr(MS, "_max_score_fwd_kernel", FakeJIT())
    info = _msa_plan_from_lengths(torch.tensor([1, 40]), torch.tensor([900, 300]), 4, num_kv_heads=4,
                                  page_size=128, output_maxscore=True, split_prefill_decode=False)

    def call(tensors=None):
        if tensors is None:
            k = torch.randn(20, 128, 4, 128, dtype=torch.bfloat16)
            tensors = (torch.randn(41, 4, 128, dtype=torch.bfloat16), k,
                       torch.randperm(20)[:2 * 8].to(torch.int32).view(2, 8), torch.empty(41, 4, 8))
        q, k, table, ms = tensors
        unused = torch.empty(41, 4, 128, dtype=torch.bfloat16)  # no attention output: ignored, None returned
        out, scores = msa(q, k, None, info, max_score=ms, output_o=False, page_table=table, out=unused)
        assert out is None and scores is ms
        return tensors

    _replays_match(call, info.plan.workspace.recipes)


def test_kvcache_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch):
    import mate.mha_interface as M
    import mate.ops.mha.attention as A

    monkeypatch.setattr(A, "_mha_fwd_kernel", FakeJIT())
    monkeypatch.setattr(M, "_KVCACHE_RECIPES", R.RecipeCache())
    lens = torch.tensor([300, 17, 64, 1], dtype=torch.int32)

    def call(tensors=None):
        if tensors is None:
            k = torch.randn(24, 64, 2, 64, dtype=torch.float16)
            tensors = (torch.randn(4, 1, 8, 64, dtype=torch.float16), k, torch.randn_like(k),
                       torch.randperm(24)[:20].to(torch.int32).view(4, 5))
        q, k, v, table = tensors
        out, lse = M.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=table, causal=True,
                                             return_softmax_lse=True)
        assert out.shape == q.shape and lse.shape == (4, 8, 1)
        return tensors

    _replays_match(call, M._KVCACHE_RECIPES)


def test_sparse_mla_decode_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch):
    """Per metadata object: the split decode and its combine, out allocated and the LSE
    returned (also allocated), and a metadata-less call, which never records."""
    import mate.ops.sparse_mla.decode as D
    import mate.sparse_mla_interface as S
    from mate.ops.sparse_mla.metadata import plan_decode

    for name in ("sparse_mla_decode_split_kernel", "sparse_mla_decode_split_kernel_t",
                 "sparse_mla_decode_combine_kernel"):
        monkeypatch.setattr(D, name, FakeJIT())
    monkeypatch.setattr(S, "recipes_usable", lambda t: R.RECIPES and L.active_recording() is None)
    monkeypatch.setattr(S, "select_backend", lambda device, override=None: "triton")
    B, H, top_k = 3, 16, 128
    meta = plan_decode(B, 1, H, top_k, "cpu", num_splits=2)
    assert meta.num_splits == 2
    seq_lens = torch.tensor([128, 70, 5], dtype=torch.int32)

    def call(tensors=None, metadata=meta):
        if tensors is None:
            tensors = (torch.randn(B, 1, H, 576).to(torch.float8_e4m3fn),
                       torch.randn(4, 64, 576).to(torch.float8_e4m3fn),
                       torch.randint(-1, 256, (B, 1, top_k), dtype=torch.int32))
        q, kv, bt = tensors
        out, lse = S.sparse_mla_fp8_decode(q, kv, None, 128, 512, 64, bt, seq_lens, 256, sparse_mla_top_k=top_k,
                                           bmm1_scale=0.04, return_lse=True, metadata=metadata)
        assert out.shape == (B, 1, H, 512) and lse.shape == (B, 1, H)
        return tensors

    monkeypatch.setattr(S, "_DECODE_RECIPES", weakref.WeakKeyDictionary())
    monkeypatch.setattr(S, "_IMPLICIT_PLANS", collections.OrderedDict())
    S._DECODE_RECIPES[meta] = cache = R.RecipeCache()  # the one a first call would make
    _replays_match(call, cache)

    # without metadata: the first call keeps its plan, the later ones of its shape use it and its recipes
    call(metadata=None)
    assert list(S._DECODE_RECIPES) == [meta] and len(S._IMPLICIT_PLANS) == 1
    kept = next(iter(S._IMPLICIT_PLANS.values()))
    assert kept is not meta and (kept.batch_size, kept.q_len, kept.num_heads, kept.top_k) == (B, 1, H, top_k)
    S._DECODE_RECIPES[kept] = kept_cache = R.RecipeCache()
    _replays_match(lambda tensors=None: call(tensors, metadata=None), kept_cache)
    assert list(S._IMPLICIT_PLANS.values()) == [kept]


@pytest.mark.parametrize("outputs", ["merged", "omitted"])
def test_rope_quantize_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch, outputs):
    """Outputs as views of one merged [nnz, H, 576] query row and [nnz, 576] key row (they
    overlap each other, never an input), or all omitted (allocated per call)."""
    import mate.ops.sparse_mla.rope_quant as RQ
    import mate.sparse_mla_interface as S

    monkeypatch.setattr(RQ, "mla_rope_quantize_fp8_kernel", FakeJIT())
    monkeypatch.setattr(S, "recipes_usable", lambda t: R.RECIPES and L.active_recording() is None)
    monkeypatch.setattr(S, "select_backend", lambda device, override=None: "triton")
    monkeypatch.setattr(S, "_ROPE_RECIPES", R.RecipeCache())
    nnz, H = 5, 16

    def call(tensors=None):
        if tensors is None:
            q = torch.randn(nnz, H, 576, dtype=torch.bfloat16)
            k = torch.randn(nnz, 576, dtype=torch.bfloat16)
            tensors = (q[..., 512:], k[:, 512:], q[..., :512], k[:, :512], torch.randn(64, 64),
                       torch.randint(0, 64, (nnz,)), torch.empty(nnz, H, 576, dtype=torch.float8_e4m3fn),
                       torch.empty(nnz, 576, dtype=torch.float8_e4m3fn))
        *inputs, q_out, k_out = tensors
        kw = {}
        if outputs == "merged":
            kw = dict(q_rope_out=q_out[..., 512:], k_rope_out=k_out[:, 512:], q_nope_out=q_out[..., :512],
                      k_nope_out=k_out[:, :512])
        res = S.mla_rope_quantize_fp8(*inputs, quant_scale_q=0.5, quant_scale_kv=2.0, **kw)
        assert [r.shape for r in res] == [t.shape for t in inputs[:4]]
        assert all(r.dtype == torch.float8_e4m3fn for r in res)
        if outputs == "merged":
            assert all(r is o for r, o in zip(res, kw.values()))
        return tensors

    _replays_match(call, S._ROPE_RECIPES)
    if outputs == "merged":  # an output on an input: the replay declines, the ordinary path raises
        q_in, k_in, qn_in, kn_in, cos, pos, q_out, k_out = call()
        replays = S._ROPE_RECIPES.replays
        # a merged query buffer of the recorded signature laid over the input query's bytes
        alias = torch.empty(0, dtype=torch.float8_e4m3fn).set_(q_in.untyped_storage())[:nnz * H * 576]
        alias = alias.view(nnz, H, 576)
        with pytest.raises(ValueError, match="q_rope_out must not overlap"):
            S.mla_rope_quantize_fp8(q_in, k_in, qn_in, kn_in, cos, pos, quant_scale_q=0.5, quant_scale_kv=2.0,
                                    q_rope_out=alias[..., 512:], k_rope_out=k_out[:, 512:],
                                    q_nope_out=alias[..., :512], k_nope_out=k_out[:, :512])
        assert S._ROPE_RECIPES.replays == replays


@pytest.fixture
def stand_in_gemm(stand_in_gpu, monkeypatch):
    """gemm_fp8_nt_groupwise on stand-ins: the Triton kernels' path (TMA descriptors, split-K
    counters and workspace), a fresh recipe cache and fresh per-stream buffers."""
    import mate.gemm as G
    import mate.ops.gemm.groupwise as GW

    for name in ("fp8_groupwise_tma_kernel", "fp8_groupwise_gemm_kernel", "splitk_reduce_kernel"):
        monkeypatch.setattr(GW, name, FakeJIT())
    monkeypatch.setattr(G, "recipes_usable", lambda t: R.RECIPES and L.active_recording() is None)
    monkeypatch.setattr(G, "select_backend", lambda device, override=None: "triton")
    for name in ("_GROUPWISE_RECIPES", "_GROUPED_RECIPES", "_MASKED_RECIPES"):
        monkeypatch.setattr(G, name, R.RecipeCache())
    monkeypatch.setattr(GW, "_COUNTERS", {})
    monkeypatch.setattr(GW, "_WORKSPACES", {})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    return G


def _groupwise_inputs(m, n, k):
    fp8 = torch.float8_e4m3fn
    return (torch.randn(m, k).to(fp8), torch.randn(n, k).to(fp8), torch.rand(k // 128, m) + 0.5,
            torch.rand(k // 128, -(-n // 128)) + 0.5)


@pytest.mark.parametrize("mnk,reduce,given_out", [((16, 256, 2048), "fused", True), ((16, 256, 2048), "launch", False),
                                                  ((300, 384, 512), "fused", True)])
def test_groupwise_gemm_calls_replay_what_the_ordinary_path_launches(stand_in_gemm, monkeypatch, mnk, reduce,
                                                                     given_out):
    """Split-K with the fused reduce (counters and workspace of the stream) or a reduce launch,
    and a shape without split-K; ``out`` given or allocated per call."""
    monkeypatch.setenv("MATE_GEMM_SPLITK_REDUCE", reduce)
    m, n, k = mnk
    G = stand_in_gemm

    def call(tensors=None):
        if tensors is None:
            tensors = (*_groupwise_inputs(m, n, k), torch.empty(m, n, dtype=torch.bfloat16))
        a, b, sa, sb, out = tensors
        res = G.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", out=out if given_out else None,
                                      backend="triton")
        assert res.shape == (m, n) and (res is out) == given_out
        return tensors

    _replays_match(call, G._GROUPWISE_RECIPES)
    if mnk[0] == 16:
        assert any(launch[4:5] for launch in _LAUNCHES)  # split-K: the workspace kept in the recipe


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_grouped_gemm_calls_replay_what_the_ordinary_path_launches(stand_in_gemm, layout):
    """The MoE layouts: m_indices / masked_m are read on the device only, so their values may
    change between replays; ``out`` given or allocated per call."""
    G = stand_in_gemm
    fp8, groups, n, k = torch.float8_e4m3fn, 3, 256, 512

    def call(tensors=None, given_out=True):
        if tensors is None:
            b = torch.randn(groups, n, k).to(fp8)
            sb = torch.rand(groups, n // 128, k // 128)
            if layout == "contiguous":
                rows = torch.randint(-1, groups, (4 * 128,), dtype=torch.int32)
                tensors = (torch.randn(4 * 128, k).to(fp8), b, torch.rand(4 * 128, k // 128), sb, rows,
                           torch.empty(4 * 128, n, dtype=torch.bfloat16))
            else:
                tensors = (torch.randn(groups, 64, k).to(fp8), b, torch.rand(groups, 64, k // 128), sb,
                           torch.randint(0, 65, (groups,), dtype=torch.int32),
                           torch.empty(groups, 64, n, dtype=torch.bfloat16))
        *ops, rows, out = tensors
        if layout == "contiguous":
            res = G.group_deepgemm_fp8_nt_groupwise(*ops, rows, out=out if given_out else None)
        else:
            res = G.batch_deepgemm_fp8_nt_groupwise(*ops, rows, 48, out=out if given_out else None)
        assert res.shape == out.shape and (res is out) == given_out
        return tensors

    cache = G._GROUPED_RECIPES if layout == "contiguous" else G._MASKED_RECIPES
    _replays_match(call, cache)
    before = cache.replays
    for _ in range(4):
        call(given_out=False)
    assert cache.replays > before and len(cache) == 2  # the allocated output: another signature


def test_groupwise_gemm_out_dtype_in_the_key(stand_in_gemm):
    """An explicit ``out_dtype`` (a dtype is a plain key part) replays like the default; one that
    is not a dtype gets the ordinary path's error, not an allocation's."""
    G = stand_in_gemm
    a, b, sa, sb = _groupwise_inputs(64, 256, 512)
    for dtype in (torch.bfloat16, torch.float16):
        before = G._GROUPWISE_RECIPES.replays
        for _ in range(5):
            assert G.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", out_dtype=dtype,
                                           backend="triton").dtype == dtype
        assert G._GROUPWISE_RECIPES.replays > before
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        G.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", out_dtype="bf16", backend="triton")


def test_groupwise_gemm_paths_beyond_triton_launches_never_record(stand_in_gemm, monkeypatch):
    """The two-step FP8 output (a bf16 temporary, then a quantization launch) and an output that
    overlaps an input keep no recipe / never replay."""
    from mate.ops.gemm import tuning

    G = stand_in_gemm
    monkeypatch.setattr(tuning, "fp8_out_two_step", lambda *args: True)
    monkeypatch.setattr(G, "select_backend", lambda device, override=None: "triton")
    monkeypatch.setattr("mate.ops.gemm.quantize.quantize_fp8_row_groups", lambda res, out, scale: None)
    a, b, sa, sb = _groupwise_inputs(16, 256, 512)
    for _ in range(4):
        G.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", output_scale=torch.empty(16, 2))
    assert len(G._GROUPWISE_RECIPES) == 0
    out = torch.empty(16, 256, dtype=torch.bfloat16)
    for _ in range(4):
        G.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", out=out, backend="triton")
    replays = G._GROUPWISE_RECIPES.replays
    assert replays >= 1
    alias = torch.empty(0, dtype=torch.bfloat16).set_(a.untyped_storage(), 0, (16, 256), (256, 1))  # a's bytes
    with pytest.raises(ValueError, match="out must not overlap"):
        G.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="MN", out=alias, backend="triton")
    assert G._GROUPWISE_RECIPES.replays == replays


def test_sparse_mla_decode_without_metadata_keeps_a_few_plans(stand_in_gpu, monkeypatch):
    """Metadata-less calls keep one plan per (B, q_len, H, top-k, device, stream), the least
    recently used dropped past IMPLICIT_PLANS_KEPT; with recipes off a call plans for itself."""
    import mate.ops.sparse_mla.decode as D
    import mate.sparse_mla_interface as S

    for name in ("sparse_mla_decode_split_kernel", "sparse_mla_decode_split_kernel_t",
                 "sparse_mla_decode_combine_kernel"):
        monkeypatch.setattr(D, name, FakeJIT())
    monkeypatch.setattr(S, "recipes_usable", lambda t: R.RECIPES and L.active_recording() is None)
    monkeypatch.setattr(S, "select_backend", lambda device, override=None: "triton")
    monkeypatch.setattr(S, "_IMPLICIT_PLANS", collections.OrderedDict())
    monkeypatch.setattr(S, "IMPLICIT_PLANS_KEPT", 2)

    def call(B, top_k):
        q = torch.randn(B, 1, 16, 576).to(torch.float8_e4m3fn)
        kv = torch.randn(4, 64, 576).to(torch.float8_e4m3fn)
        bt = torch.randint(-1, 256, (B, 1, top_k), dtype=torch.int32)
        S.sparse_mla_fp8_decode(q, kv, None, 128, 512, 64, bt, torch.full((B,), 5, dtype=torch.int32), 256,
                                sparse_mla_top_k=top_k, bmm1_scale=0.04)

    def kept():
        return [(k[0], k[3]) for k in S._IMPLICIT_PLANS]

    with R.disabled():
        call(2, 64)
    assert kept() == []
    call(2, 64), call(2, 128), call(2, 64)
    assert kept() == [(2, 128), (2, 64)]  # most recently used last
    first = S._IMPLICIT_PLANS[next(reversed(S._IMPLICIT_PLANS))]
    call(3, 64)
    assert kept() == [(2, 64), (3, 64)]
    call(2, 64)
    assert S._IMPLICIT_PLANS[next(k for k in S._IMPLICIT_PLANS if k[0] == 2)] is first
    import mate.ops.sparse_mla.metadata as MD

    monkeypatch.setattr(MD, "GLUON_MIN_SPLIT_BLOCKS", 3)  # a planning setting changed: a new plan
    call(2, 64)
    assert kept() == [(2, 64), (2, 64)] and S._IMPLICIT_PLANS[next(reversed(S._IMPLICIT_PLANS))] is not first
    with pytest.raises(ValueError, match="sparse_mla_top_k"):  # a kept key still gets every check
        S.sparse_mla_fp8_decode(torch.randn(2, 1, 16, 576).to(torch.float8_e4m3fn),
                                torch.randn(4, 64, 576).to(torch.float8_e4m3fn), None, 128, 512, 64,
                                torch.zeros(2, 1, 128, dtype=torch.int32), torch.full((2,), 5, dtype=torch.int32),
                                256, sparse_mla_top_k=64, bmm1_scale=0.04)


@pytest.mark.parametrize("given_output", [True, False])
def test_topk_select_calls_replay_what_the_ordinary_path_launches(stand_in_gpu, monkeypatch, given_output):
    import mate.msa_interface as MI
    import mate.ops.msa.topk as T
    import mate.ops.msa.topk_warps as TW

    for module, name in ((T, "_topk_lanes_fast_kernel"), (T, "_topk_lanes_kernel"), (T, "_topk_interval_kernel"),
                         (T, "_topk_select_kernel"), (TW, "_topk_lanes_warps_kernel")):
        monkeypatch.setattr(module, name, FakeJIT())
    monkeypatch.setattr(MI, "_TOPK_RECIPES", R.RecipeCache())

    def call(tensors=None):
        if tensors is None:
            tensors = (torch.randn(40, 4, 64), torch.arange(40, dtype=torch.int64) * 100,
                       torch.empty(40, 4, 17, dtype=torch.int32))
        scores, pos, out = tensors
        res = MI.sparse_topk_select(scores, 16, output=out if given_output else None, force_end_blocks=1,
                                    force_blocks_count_in_topk=False, query_positions=pos)
        assert res.shape == (40, 4, 17) and (res is out) == given_output
        return tensors

    _replays_match(call, MI._TOPK_RECIPES)
