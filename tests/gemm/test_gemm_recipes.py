"""Launch recipes of eager GEMM calls (GPU): from the third or fourth call of a signature the
call replays the launches of its first calls, bit for bit what the ordinary path writes, on
fresh operands every call. ``gemm_fp8_nt_groupwise`` on each kernel ``auto`` and ``triton``
pick at small and mid M (the K-interleaved Gluon kernel with and without split-K, the
single-partition Gluon kernel, the plain Triton kernels with A by pointer loads and the fused
FP8 epilogue); cuBLAS and the two-step FP8 output never replay. The MoE layouts (contiguous on
the Triton and the persistent Gluon kernel, masked) replay with new group layouts every call."""

from __future__ import annotations

import pytest
import torch

from mate import gemm
from mate._core import recipe as R
from mate.testing import poisoned, rand_fp8
from mate.testing.graphs import capture_graph
from tests.gemm._inputs import fp8_block_operands

pytestmark = pytest.mark.gpu

CASES = [  # (m, n, k, backend, fp8 output, replays)
    (1, 2112, 7168, "auto", False, True),      # K-interleaved Gluon, split-K with the fused reduce
    (64, 4096, 7168, "auto", False, True),     # K-interleaved Gluon, unsplit
    (16, 7168, 2048, "auto", False, True),     # single-partition Gluon
    (16, 4096, 7168, "auto", False, True),     # 16-row Triton tile, split-K
    (256, 7168, 2048, "triton", False, True),  # plain Triton, TMA
    (1, 2112, 7168, "triton", True, True),     # fused FP8 epilogue, A by pointer loads, split-K
    (4096, 4096, 7168, "auto", False, False),  # cuBLAS
    (64, 4096, 7168, "auto", True, False),     # two-step FP8 output (a bf16 temporary)
]


def _call(ops, out, oscale, backend):
    a, b, sa, sb = ops
    return gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, output_scale=oscale,
                                      backend=backend)


@pytest.mark.parametrize("m,n,k,backend,fp8_out,replays", CASES)
def test_replayed_gemms_equal_the_ordinary_path(m, n, k, backend, fp8_out, replays, monkeypatch):
    monkeypatch.setattr(gemm, "_GROUPWISE_RECIPES", R.RecipeCache())
    out_dtype = torch.float8_e4m3fn if fp8_out else torch.bfloat16
    nb = -(-n // 128)

    def outputs():
        return poisoned((m, n), out_dtype, "cuda"), poisoned((m, nb), torch.float32, "cuda") if fp8_out else None

    with R.disabled():
        _call(fp8_block_operands(m, n, k, "cuda"), *outputs(), backend)  # compiles
    for call in range(5):
        ops = fp8_block_operands(m, n, k, "cuda")
        out, oscale = outputs()
        before = gemm._GROUPWISE_RECIPES.replays
        assert _call(ops, out, oscale, backend) is out
        replayed = gemm._GROUPWISE_RECIPES.replays > before
        want, want_scale = outputs()
        with R.disabled():
            _call(ops, want, want_scale, backend)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8)), f"call {call}: output differs"
        if fp8_out:
            assert torch.equal(oscale, want_scale), f"call {call}: output scales differ"
        if call >= 3:
            assert replayed == replays, f"call {call}"


def test_replay_keeps_the_overlap_check_and_the_split_k_stream(monkeypatch):
    """An ``out`` laid over an operand still raises; a call on another stream is another key
    (its own split-K counters and workspace) and right; a capture, also on a stream whose recipe
    is trusted, takes the ordinary path, and its graph replayed after new operands is right."""
    monkeypatch.setattr(gemm, "_GROUPWISE_RECIPES", R.RecipeCache())
    m, n, k = 1, 2112, 7168
    ops = fp8_block_operands(m, n, k, "cuda")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(5):
        _call(ops, out, None, "auto")
    replays = gemm._GROUPWISE_RECIPES.replays
    assert replays >= 1 and len(gemm._GROUPWISE_RECIPES) == 1
    alias = torch.empty(0, dtype=torch.bfloat16, device="cuda").set_(ops[1].untyped_storage(), 0, (m, n), (n, 1))
    with pytest.raises(ValueError, match="out must not overlap"):
        _call(ops, alias, None, "auto")
    assert gemm._GROUPWISE_RECIPES.replays == replays
    want = poisoned((m, n), torch.bfloat16, "cuda")
    with R.disabled():
        _call(ops, want, None, "auto")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = [_call(ops, poisoned((m, n), torch.bfloat16, "cuda"), None, "auto") for _ in range(5)]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert len(gemm._GROUPWISE_RECIPES) == 2 and gemm._GROUPWISE_RECIPES.replays > replays
    assert all(torch.equal(g, want) for g in got)
    replays = gemm._GROUPWISE_RECIPES.replays
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # a stream with a trusted recipe: captured the ordinary way
        _call(ops, out, None, "auto")
    assert gemm._GROUPWISE_RECIPES.replays == replays
    _assert_replay_with_new_operands(graph, ops, out)
    _assert_replay_with_new_operands(capture_graph(lambda: _call(ops, out, None, "auto")), ops, out)


def _assert_replay_with_new_operands(graph, ops, out):
    """New operands written in place, the graph replayed: ``out`` equals the ordinary path's."""
    m, n = out.shape
    for t, x in zip(ops, fp8_block_operands(m, n, ops[0].shape[1], "cuda")):
        t.copy_(x)
    out.fill_(float("nan"))
    graph.replay()
    want = poisoned(out.shape, out.dtype, "cuda")
    with R.disabled():
        _call(ops, want, None, "auto")
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def _contiguous_layout(blocks: int, groups: int) -> torch.Tensor:
    """m_indices of ``blocks`` 128-row blocks: each group one contiguous run of whole blocks (a
    random count, some empty), its last rows padding (-1), other layouts on every call."""
    counts = torch.multinomial(torch.ones(groups), blocks, replacement=True).bincount(minlength=groups)
    idx = []
    for g, c in enumerate(counts.tolist()):
        rows = [g] * (c * 128)
        if c:
            pad = int(torch.randint(0, 100, ()))
            rows[len(rows) - pad:] = [-1] * pad
        idx += rows
    return torch.tensor(idx, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("layout,blocks,n,k", [("contiguous", 8, 4096, 7168),    # Triton (256 tiles, below 448)
                                               ("contiguous", 64, 4096, 2048),   # persistent Gluon (2048 tiles)
                                               ("masked", 0, 4096, 7168)])
def test_replayed_grouped_gemms_equal_the_ordinary_path(layout, blocks, n, k, monkeypatch):
    """The MoE layouts replay with new group layouts (m_indices / masked_m values) every call;
    the rows a call writes equal the ordinary path's bit for bit."""
    cache = R.RecipeCache()
    monkeypatch.setattr(gemm, "_GROUPED_RECIPES" if layout == "contiguous" else "_MASKED_RECIPES", cache)
    groups, max_m = 8, 128

    def inputs():
        b = rand_fp8((groups, n, k), device="cuda", scale=2.0)
        sb = torch.rand(groups, n // 128, k // 128, device="cuda") * 0.02 + 0.005
        if layout == "contiguous":
            m = blocks * 128
            return (rand_fp8((m, k), device="cuda", scale=2.0), b, torch.rand(m, k // 128, device="cuda") * 0.02,
                    sb, _contiguous_layout(blocks, groups))
        return (rand_fp8((groups, max_m, k), device="cuda", scale=2.0), b,
                torch.rand(groups, max_m, k // 128, device="cuda") * 0.02, sb,
                torch.randint(0, max_m + 1, (groups,), dtype=torch.int32, device="cuda"))

    def run(ops, out):
        if layout == "contiguous":
            return gemm.group_deepgemm_fp8_nt_groupwise(*ops, out=out)
        return gemm.batch_deepgemm_fp8_nt_groupwise(*ops, 64, out=out)

    def written(ops, out):
        if layout == "contiguous":
            return out[ops[4] >= 0]
        rows = torch.arange(max_m, device="cuda")[None, :] < ops[4][:, None]
        return out[rows]

    shape = (blocks * 128, n) if layout == "contiguous" else (groups, max_m, n)
    with R.disabled():
        run(inputs(), poisoned(shape, torch.bfloat16, "cuda"))  # compiles
    for call in range(5):
        ops = inputs()
        out = poisoned(shape, torch.bfloat16, "cuda")
        before = cache.replays
        assert run(ops, out) is out
        replayed = cache.replays > before
        want = poisoned(shape, torch.bfloat16, "cuda")
        with R.disabled():
            run(ops, want)
        torch.cuda.synchronize()
        got, ref = written(ops, out), written(ops, want)
        assert not got.isnan().any() and torch.equal(got, ref), f"call {call}: output differs"
        if call >= 3:
            assert replayed, f"call {call}"
