"""GPU suite of the GEMM family (run on the H200 through benchmarks/run_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.testing import assert_close, poisoned, rand_fp8, randn
from mate.testing.graphs import capture_graph
from mate.testing.inputs import grouped_contiguous_operands
from tests.gemm._inputs import assert_fp8_output_close, fp8_block_operands, launch_groupwise_plain

pytestmark = pytest.mark.gpu

# bf16 outputs of fp32 accumulations: the kernel (tensor-core fp32 accumulation, other
# order) and the reference differ by ~1e-5 relative before the single bf16 rounding; the
# default bf16 tolerance covers it. Norm-wise we ask for 1e-2.


@pytest.mark.parametrize("m", [1, 16, 32, 64, 4096])
@pytest.mark.parametrize("nk", [(2112, 7168), (24576, 1536), (7168, 2048), (4096, 7168)])
@pytest.mark.parametrize("backend", ["triton", "cublas", "auto"])
def test_groupwise_deepseek_shapes(m, nk, backend):
    n, k = nk
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    if backend == "cublas" and m % 16:  # cuBLAS blockwise rejects m = 1 (measured): mate says so
        with pytest.raises(ValueError, match="multiple of 16"):
            gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", backend=backend)
        return
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    for mode in ("K", "MN"):
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend=backend)
        else:
            gemm.gemm_fp8_nt_groupwise(a, b, sa.t().contiguous(), sb.t().contiguous(), scale_major_mode="MN",
                                       out=out, backend=backend)
        assert_close(out, ref, max_rel_error=1e-2, name=f"{backend} {mode}")
    # the cuBLAS path's in-place layouts: M-major activation scale, K-major weight scale
    out = poisoned((m, n), torch.bfloat16, "cuda")
    gemm.gemm_fp8_nt_groupwise(a, b, sa.t().contiguous(), sb.t(), scale_major_mode="MN", out=out, backend=backend)
    assert_close(out, ref, max_rel_error=1e-2, name=f"{backend} MN with a K-major weight-scale view")


@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (64, 7168, 2048), (300, 4096, 7168), (512, 4096, 7168),
                                   (128, 2112, 7168), (64, 4096, 7168)])
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_groupwise_fp8_output_gpu(m, n, k, backend):
    """``triton``: the fused epilogue (fp32 accumulator quantized); ``auto`` runs the bf16 path
    and a quantization launch where ``tuning.fp8_out_two_step`` says (cuBLAS at M = 512, the
    K-interleaved kernel at (64 | 128, *, 7168)), so its check adds the bf16 rounding."""
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    nb = -(-n // 128)
    out = poisoned((m, n), torch.float8_e4m3fn, "cuda")
    oscale = poisoned((m, nb), torch.float32, "cuda")
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, out=out, output_scale=oscale, backend=backend)
    assert_fp8_output_close(out, oscale, R.groupwise_fp32_ref(a, b, sa, sb), via_bf16=backend == "auto")


@pytest.mark.parametrize("reduce", ["fused", "launch"])
def test_groupwise_split_k_deterministic_in_cuda_graph(reduce):
    """Split-K partials are summed in split order by whichever program arrives last (or by
    the second kernel): every replay of a captured call gives the same bits, and the
    arrival counters are back to 0 after each call."""
    from mate.ops.gemm import groupwise

    m, n, k = 64, 2112, 7168
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    out = poisoned((m, n), torch.bfloat16, "cuda")
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 5, "SPLIT_K": 4, "REDUCE": reduce}

    def call():
        launch_groupwise_plain(a, b, sa, sb, out, cfg)

    call()  # eager first: compiles and allocates the counters outside the capture
    torch.cuda.synchronize()
    first = out.clone()
    assert_close(first, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    if reduce == "fused":  # the capture took the eager call's buffer (it allocates none); back at 0
        eager = groupwise._COUNTERS.get(groupwise._counter_key(out.device))
        assert eager is not None and int(eager.count_nonzero()) == 0
        assert all(int(c.count_nonzero()) == 0 for c in groupwise._COUNTERS.values())


def test_split_k_capture_without_counters_falls_back_to_launch(monkeypatch):
    """A capture on a device where no eager call made a counter buffer allocates none (its
    zero fill would only run at replay) and sums the partials with the second launch: the
    fused call's bits on every replay."""
    from mate.ops.gemm import groupwise

    m, n, k = 64, 2112, 7168
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    out = poisoned((m, n), torch.bfloat16, "cuda")
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 5, "SPLIT_K": 4}

    def call(reduce):
        launch_groupwise_plain(a, b, sa, sb, out, {**cfg, "REDUCE": reduce})

    call("launch")  # compiles the reduce kernel
    call("fused")
    torch.cuda.synchronize()
    first = out.clone()
    monkeypatch.setattr(groupwise, "_COUNTERS", {})
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call("fused")
    assert groupwise._COUNTERS == {}
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)


def test_split_k_counters_are_per_stream():
    """Each stream gets its own arrival-counter buffer; the same stream gets the same one."""
    from mate.ops.gemm import groupwise

    dev = torch.device("cuda")
    here = groupwise._tile_counters(dev, 8)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        there = groupwise._tile_counters(dev, 8)
        assert groupwise._tile_counters(dev, 8) is there
    assert there is not here and groupwise._tile_counters(dev, 8) is here


@pytest.mark.parametrize("path", ["triton fused", "auto (K-interleaved, waiting split)"])
def test_split_k_calls_overlap_on_two_streams(path):
    """Fused split-K calls running at the same time on two streams (20 rounds queued behind a
    ~30 ms spin on each stream, so the two queues run together on the GPU; different operands
    per stream) each give their eager bits: their arrival counters are separate buffers. With
    one buffer per device they counted each other's arrivals."""
    from mate.ops.gemm import groupwise, tuning

    if path.startswith("auto"):
        m, n, k = 64, 2112, 7168
        assert tuning.groupwise_config(m, n, k, fp8_out=False)["GLUON"]["SPLIT_K"] > 1
    else:
        m, n, k = 48, 1024, 4096
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 5, "SPLIT_K": 4, "REDUCE": "fused"}

    def call(ops, out):
        a, b, sa, sb = ops
        if path.startswith("auto"):
            gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="auto")
        else:
            launch_groupwise_plain(a, b, sa, sb, out, cfg)

    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    ops = [fp8_block_operands(m, n, k, "cuda") for _ in streams]
    expect = []
    for o in ops:  # eager, one stream: the reference bits
        out = poisoned((m, n), torch.bfloat16, "cuda")
        call(o, out)
        assert_close(out, R.groupwise_fp32_ref(*o), max_rel_error=1e-2)
        expect.append(out)
    outs = [[poisoned((m, n), torch.bfloat16, "cuda") for _ in range(20)] for _ in streams]
    torch.cuda.synchronize()
    for s in streams:  # hold both queues until the host has enqueued every call
        with torch.cuda.stream(s):
            torch.cuda._sleep(60_000_000)
    for r in range(20):
        for s, o, row in zip(streams, ops, outs):
            with torch.cuda.stream(s):
                call(o, row[r])
    torch.cuda.synchronize()
    for e, row in zip(expect, outs):
        for r, out in enumerate(row):
            assert torch.equal(out, e), f"stream call {r} differs from the eager bits"
    assert all(int(c.count_nonzero()) == 0 for c in groupwise._COUNTERS.values())


def test_bmm_bf16_cublas_no_copy(monkeypatch):
    from mate.ops.gemm import cublas

    seen = {}
    real = cublas.bmm_cublas

    def spy(A, B, out):
        seen.update(a=A.data_ptr(), b=B.data_ptr(), bs=B.stride())
        return real(A, B, out)

    monkeypatch.setattr(cublas, "bmm_cublas", spy)
    A = randn((4, 256, 512), device="cuda")
    Bt = randn((4, 384, 512), device="cuda")
    B = Bt.transpose(1, 2)
    for out_dtype in (torch.bfloat16, torch.float32):
        out = gemm.bmm_bf16(A, B, out_dtype=out_dtype)
        assert seen == {"a": A.data_ptr(), "b": Bt.data_ptr(), "bs": B.stride()}
        # fp32 out: accumulation order over k=512 terms of |x| ~ 1 (sums ~ 22): ~1e-4 absolute
        tol = dict(atol=1e-3, rtol=1e-4) if out_dtype == torch.float32 else {}
        assert_close(out, R.bmm_ref(A, B, torch.float32).to(out_dtype), max_rel_error=1e-2, **tol)
    out_t = gemm.bmm_bf16(A, B, backend="triton")
    assert_close(out_t, R.bmm_ref(A, B, torch.float32).bfloat16())


@pytest.mark.parametrize("backend", ["cublas", "triton"])
def test_bmm_fp8_gpu(backend):
    b, m, n, k = 3, 128, 512, 1024
    A = rand_fp8((b, m, k), device="cuda")
    B = rand_fp8((b, n, k), device="cuda").transpose(1, 2)
    sa = torch.rand(1, device="cuda") + 0.5
    sb = torch.rand(1, device="cuda") + 0.5
    out = poisoned((b, m, n), torch.bfloat16, "cuda")
    gemm.bmm_fp8(A, B, sa, sb, torch.bfloat16, out=out, backend=backend)
    ref = R.bmm_fp8_ref(A, B, sa, sb, torch.float32)
    # FP8 tensor-core accumulation keeps ~14 bits: near-zero outputs (cancellation) carry an
    # absolute error of ~1e-4 of the output magnitude (measured 0.011 at max |ref| ~ 150)
    fp8_atol = 1e-3 * float(ref.abs().max())
    assert_close(out, ref, atol=fp8_atol, max_rel_error=1e-2)
    if backend == "triton":
        sa_c = torch.rand(b, m, 1, device="cuda") + 0.5
        sb_c = torch.rand(b, 1, n, device="cuda") + 0.5
        out = gemm.bmm_fp8(A, B, sa_c, sb_c, torch.float16)
        ref = R.bmm_fp8_ref(A, B, sa_c, sb_c, torch.float32)
        assert_close(out, ref, atol=1e-3 * float(ref.abs().max()), max_rel_error=1e-2)


@pytest.mark.parametrize("n,k,rows,gluon", [(4096, 7168, [300, 0, 128, 517], False),  # 288 tiles
                                            (4096, 7168, [300, 0, 128, 1200], True),  # 448 tiles
                                            (4096, 1024, [4196, 0, 4096, 8000], True)])  # 4096 tiles
def test_grouped_contiguous_gpu(n, k, rows, gluon):
    """The contiguous layout on both kernels (Gluon from ``GLUON_GROUPED_MIN_TILES`` tiles)."""
    from mate.ops.gemm import tuning

    m_total = sum(-(-r // 128) * 128 for r in rows)
    assert bool(tuning.grouped_config(m_total, n, k).get("GLUON")) == gluon
    idx, a, sa, b, sb = grouped_contiguous_operands(rows, n, k, device="cuda")
    m = idx.numel()
    out = poisoned((m, n), torch.bfloat16, "cuda")
    gemm.group_deepgemm_fp8_nt_groupwise(a, b, sa, sb, idx, out=out)
    ref = R.grouped_contiguous_ref(a, b, sa, sb, idx, torch.float32)
    valid = idx >= 0
    assert_close(out[valid], ref[valid], max_rel_error=1e-2)


def test_masked_cuda_graph_replay():
    G, max_m, n, k = 8, 128, 4096, 7168
    a = rand_fp8((G, max_m, k), device="cuda", scale=2.0)
    sa = torch.rand(G, max_m, k // 128, device="cuda") * 0.02 + 0.005
    b = rand_fp8((G, n, k), device="cuda", scale=2.0)
    sb = torch.rand(G, n // 128, k // 128, device="cuda") * 0.02 + 0.005
    masked_m = torch.tensor([64, 0, 128, 1, 77, 5, 128, 30], dtype=torch.int32, device="cuda")
    out = poisoned((G, max_m, n), torch.bfloat16, "cuda")
    fn = lambda: gemm.batch_deepgemm_fp8_nt_groupwise(a, b, sa, sb, masked_m, 64, out=out)
    graph = capture_graph(fn)
    for counts in ([64, 0, 128, 1, 77, 5, 128, 30], [0, 128, 3, 64, 0, 100, 1, 127]):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.view(torch.int16).fill_(0x7FC0)  # bf16 NaN
        graph.replay()
        torch.cuda.synchronize()
        ref = R.masked_ref(a, b, sa, sb, masked_m, torch.float32)
        for g, r in enumerate(counts):
            if r:
                assert_close(out[g, :r], ref[g, :r], max_rel_error=1e-2, name=f"group {g}")
            else:  # masked_m 0: the group is not written
                assert bool(torch.isnan(out[g].float()).all()), f"group {g} written"
