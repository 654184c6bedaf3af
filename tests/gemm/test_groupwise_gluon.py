"""The Gluon groupwise kernel (``config["GLUON"]``) against the reference on Hopper.

On a machine without a Hopper GPU only the dispatch is checked: the option falls back to
the plain-Triton kernel (interpreter), with the same results as without it.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.ops.gemm import tuning
from mate.ops.gemm.groupwise import CONTIGUOUS, PLAIN, groupwise_gemm_triton
from mate.testing import assert_close, poisoned, rand_fp8
from mate.testing.inputs import grouped_contiguous_operands
from tests._sm90 import sm90_build_reports
from tests.gemm._inputs import fp8_block_operands, launch_groupwise_plain


def kernel_kind(cfg: dict) -> str:
    """Which Gluon kernel a ``tuning.GROUPWISE_GLUON`` config runs: "kint", "flat" or "gluon"."""
    return "kint" if cfg.get("KINT") else "flat" if cfg.get("FLAT") else "gluon"


def auto_configs(kind: str) -> dict:
    """The distinct configs of ``tuning.GROUPWISE_GLUON`` for one kernel (``kernel_kind``), each
    named after the first bucket that picks it (several buckets share one config)."""
    out: dict[str, dict] = {}
    for key, cfg in tuning.GROUPWISE_GLUON.items():
        if kernel_kind(cfg) == kind and cfg not in out.values():
            out[f"auto {key}"] = cfg
    return out


CONFIGS = {
    "128x128 st6": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 6},
    "128x64 st8": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 8},
    "64x128 st6": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 6},
    "64x32 st16": {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 16},
    "128x16 st10": {"BLOCK_M": 128, "BLOCK_N": 16, "num_stages": 10},
    "128x192 st4": {"BLOCK_M": 128, "BLOCK_N": 192, "num_stages": 4},
    # the configs backend="auto" picks (tuning.GROUPWISE_GLUON; its K-interleaved ones in KINT_CONFIGS)
    **auto_configs("gluon"),
}


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _plain(a, b, sa, sb, out, cfg):
    launch_groupwise_plain(a, b, sa, sb, out, {"GLUON": True, "GROUP_M": 8, "num_warps": 4, **cfg})


def _grouped(cfg, idx, a, sa, b, sb):
    out = poisoned((idx.numel(), b.shape[1]), torch.bfloat16, a.device.type)
    groupwise_gemm_triton(a, b, sa, (0, sa.stride(0), 1), sb, (sb.stride(0), sb.stride(1), 1), out, None,
                          layout=CONTIGUOUS, config=cfg, m_indices=idx)
    ref = R.grouped_contiguous_ref(a, b, sa, sb, idx, torch.float32)
    valid = (idx >= 0) & (idx < b.shape[0])
    assert_close(out[valid], ref[valid], max_rel_error=1e-2)
    assert torch.isnan(out[~valid].float()).all()  # padding rows are not written


def test_gluon_option_falls_back_off_hopper():
    if _hopper():
        pytest.skip("covered by the GPU tests")
    a, b, sa, sb = fp8_block_operands(64, 192, 256)
    out = poisoned((64, 192), torch.bfloat16, "cpu")
    _plain(a, b, sa, sb, out, {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2})
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)


def test_grouped_default_falls_back_off_hopper():
    """The grouped default's Gluon overrides (a 192-wide tile) do not reach the Triton kernel."""
    if _hopper():
        pytest.skip("covered by the GPU tests")
    cfg = tuning.grouped_config(1 << 20, 4096, 7168)
    assert isinstance(cfg["GLUON"], dict) and cfg["GLUON"]["BLOCK_N"] == 192 and cfg["BLOCK_N"] == 128
    _grouped(cfg, *grouped_contiguous_operands([70, 0, 128], 192, 256, "cpu"))


def test_auto_gluon_configs():
    """Gluon overrides only for bf16/fp16 output; the Triton config beside them is unchanged."""
    # the single-partition kernel (groupwise_gluon_flat.py), its Triton config beside it unchanged
    flat = {"FLAT": True, "BLOCK_M": 64, "KPS": 2}
    eager = {**flat, "EAGER": True}
    cfg = tuning.groupwise_config(64, 7168, 2048, fp8_out=False)
    assert cfg["GLUON"] == {**eager, "BLOCK_N": 32, "num_stages": 3}  # 64x32 tiles since session 14
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"], cfg["num_stages"]) == (64, 64, 1, 5)
    assert "GLUON" not in tuning.groupwise_config(64, 7168, 2048, fp8_out=True)
    cfg = tuning.groupwise_config(100, 7168, 2048, fp8_out=False)
    assert cfg["GLUON"] == {**eager, "BLOCK_N": 64, "num_stages": 3}
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"], cfg["num_stages"]) == (64, 128, 1, 5)
    for m in (1, 16):
        assert tuning.groupwise_config(m, 7168, 2048, fp8_out=False)["GLUON"] == {**eager, "BLOCK_N": 64,
                                                                                   "num_stages": 4}
    assert tuning.groupwise_config(32, 7168, 2048, fp8_out=False)["GLUON"] == {**eager, "BLOCK_N": 64,
                                                                                "num_stages": 3, "KPS": 4}
    for m in (1, 16):
        assert tuning.groupwise_config(m, 24576, 1536, fp8_out=False)["GLUON"] == {**eager, "BLOCK_N": 64,
                                                                                    "num_stages": 2}
    for m in (32, 64):
        assert tuning.groupwise_config(m, 24576, 1536, fp8_out=False)["GLUON"] == {**flat, "BLOCK_N": 64,
                                                                                    "num_stages": 2}
    assert tuning.groupwise_config(16, 32768, 512, fp8_out=False)["GLUON"] == {**flat, "BLOCK_N": 128, "num_stages": 2}
    # (65-128, 32768, 512): the eager single-partition kernel where cuBLAS would re-lay a scale out
    assert tuning.groupwise_config(128, 32768, 512, fp8_out=False)["GLUON"] == {**eager, "BLOCK_N": 128,
                                                                                 "num_stages": 2}
    assert tuning.groupwise_backend(128, 32768, 512, scales_in_place=False) == "triton"
    for m, n, k in ((128, 24576, 1536), (64, 32768, 512), (128, 32768, 512), (16, 24576, 1536)):
        cfg = tuning.groupwise_config(m, n, k, fp8_out=True)
        assert "GLUON" not in cfg, (m, n, k)
    assert "GLUON" not in tuning.groupwise_config(128, 24576, 1536, fp8_out=False)
    assert tuning.groupwise_backend(256, 32768, 512) == "cublas"
    for m in (1, 16):  # the 16-row Triton tile
        cfg = tuning.groupwise_config(m, 4096, 7168, fp8_out=False)
        assert "GLUON" not in cfg and (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"]) == (16, 64, 4)


# the K-interleaved configs auto picks at K = 7168 (measured at M = 64 / 128, kept for the M bucket)
AUTO_KINT = {
    (16, 2112): {"BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 2},
    (32, 2112): {"BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 2},
    (32, 4096): {"BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 1},
    (64, 2112): {"BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 2},
    (64, 4096): {"BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 1},
    (128, 2112): {"BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": 2},
    (128, 4096): {"BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": 1},
}


def test_auto_kint_configs():
    """M 1-16 and 17-32 at N 2112, 17-32, 33-64 and 65-128 at N 2112 / 4096, K 7168: the
    K-interleaved kernel with its own SPLIT_K and stages; the Triton config beside it (off
    Hopper, FP8 output) is its bucket's."""
    for (mb, n), want in AUTO_KINT.items():
        for m in (1 if mb == 16 else mb // 2 + 1, mb):
            cfg = tuning.groupwise_config(m, n, 7168, fp8_out=False)
            assert cfg["GLUON"] == {"KINT": True, "BLOCK_M": 64, "EAGER": True, **want}, (m, n)
            assert "GLUON" not in tuning.groupwise_config(m, n, 7168, fp8_out=True)
            if mb >= 64:
                assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT_K"]) == (64, 64, 4 if n == 2112 else 2), (m, n)
    k16_64 = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": 1, "EAGER": True}
    k16_128 = {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 6, "KPS": 1, "SPLIT_K": 1}
    k16 = {16: k16_64, 32: k16_64, 64: k16_64, 128: k16_128}
    for mb, want in k16.items():  # K = 16384, N = 7168
        for m in (1 if mb == 16 else mb // 2 + 1, mb):
            assert tuning.groupwise_config(m, 7168, 16384, fp8_out=False)["GLUON"] == {"KINT": True, **want}, m
    for m, n, k in ((129, 2112, 7168), (129, 7168, 16384), (64, 7168, 7168), (64, 2112, 2048), (16, 4096, 7168)):
        assert not tuning.groupwise_config(m, n, k, fp8_out=False).get("GLUON", {}).get("KINT"), (m, n, k)
    for key, cfg in tuning.GROUPWISE_GLUON.items():  # else the Triton config's split and stages would apply
        if cfg.get("KINT"):
            assert {"SPLIT_K", "num_stages", "KPS", "BLOCK_M", "BLOCK_N"} <= set(cfg), key


@pytest.mark.parametrize("shape", [(64, 7168, 2048), (64, 2112, 7168)])
def test_auto_gluon_config_falls_back_off_hopper(shape):
    """Off Hopper (interpreter) the Triton part of auto's Gluon / K-interleaved config runs
    (its 64x64 tile and 4 K splits for (64, 2112, 7168) on a small problem)."""
    if _hopper():
        pytest.skip("covered by the GPU tests")
    a, b, sa, sb = fp8_block_operands(64, 192, 512)
    out = poisoned((64, 192), torch.bfloat16, "cpu")
    cfg = tuning.groupwise_config(*shape, fp8_out=False)
    assert cfg["GLUON"]
    launch_groupwise_plain(a, b, sa, sb, out, cfg)
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)


def test_gluon_rejects_unknown_tiles():
    from mate.ops.gemm.groupwise_gluon import groupwise_gemm_gluon

    a, b, sa, sb = fp8_block_operands(64, 192, 256)
    out = torch.empty(64, 192, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no 64x256 tile"):
        groupwise_gemm_gluon(a, b, sa, (0, sa.stride(0), 1), sb, (0, sb.stride(0), 1), out, layout=PLAIN,
                             config={"BLOCK_M": 64, "BLOCK_N": 256})


def test_gluon_rejects_bad_kps():
    from mate.ops.gemm.groupwise_gluon import groupwise_gemm_gluon

    a, b, sa, sb = fp8_block_operands(64, 192, 256)
    out = torch.empty(64, 192, dtype=torch.bfloat16)
    for kps in (0, 5, 2.0):
        with pytest.raises(ValueError, match="KPS"):
            groupwise_gemm_gluon(a, b, sa, (0, sa.stride(0), 1), sb, (0, sb.stride(0), 1), out, layout=PLAIN,
                                 config={"BLOCK_M": 64, "BLOCK_N": 64, "KPS": kps})


def test_plain_only_kernels_check_shapes():
    """The K-interleaved and single-partition launchers share one shape check: 2-D operands,
    equal K, a multiple of 128; the error names the kernel."""
    from mate.ops.gemm.groupwise_gluon import plain_mnk

    a, b, _, _ = fp8_block_operands(3, 192, 256)
    assert plain_mnk(a, b, "K-interleaved") == (3, 192, 256)
    with pytest.raises(ValueError, match="the K-interleaved Gluon GEMM takes the PLAIN layout"):
        plain_mnk(a, b[None], "K-interleaved")
    with pytest.raises(ValueError, match=r"the single-partition Gluon GEMM needs .* K a multiple of 128"):
        plain_mnk(a, b[:, :128], "single-partition")
    with pytest.raises(ValueError, match="K a multiple of 128"):
        plain_mnk(a[:, :200], b[:, :200], "single-partition")


def test_grouped_default_config():
    cfg = tuning.grouped_config(4 * 8192, 4096, 7168)
    assert {**cfg, **cfg["GLUON"]}["BLOCK_N"] == 192 and cfg["GLUON"]["EPI_TMA"]
    # the Gluon kernel keeps 128-row tiles; the Triton kernel beside it (and below the
    # threshold) runs 64-row tiles on one warpgroup (session 21)
    assert {**cfg, **cfg["GLUON"]}["BLOCK_M"] == 128 and (cfg["BLOCK_M"], cfg["num_warps"]) == (64, 4)
    assert tuning.grouped_config(256, 4096, 7168)["BLOCK_M"] == tuning.masked_config(512, 4096, 7168)["BLOCK_M"] == 64
    assert "GLUON" in tuning.grouped_config(8 * 128, 7168, 2048)  # 448 tiles: GLUON_GROUPED_MIN_TILES
    assert "GLUON" not in tuning.grouped_config(7 * 128, 7168, 2048)
    assert "GLUON" not in tuning.grouped_config(256, 4096, 7168)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (24, 4160, 1024), (64, 4096, 7168), (128, 24576, 1536),
                                   (300, 7168, 2048)])
def test_gluon_plain(name, m, n, k):
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    for mode in ("K", "MN"):  # the scales read in place through their strides
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            _plain(a, b, sa, sb, out, CONFIGS[name])
        else:
            sa_mn, sb_mn = sa.t().contiguous(), sb.t().contiguous()
            _plain(a, b, sa_mn.t(), sb_mn.t(), out, CONFIGS[name])
        assert_close(out, ref, max_rel_error=1e-2, name=f"{name} {mode}")


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", ["default", "128x128 st6", "128x64 st8", "128x16 st10"])
@pytest.mark.parametrize("rows,n,k,tail", [
    ([300, 0, 128, 517], 4096, 7168, 0),  # padding rows, an empty group; N = 21 x 192 + 64
    ([256, 128, 384], 2112, 1024, 0),  # 128-row aligned groups: every tile by the TMA-store epilogue
    ([129, 1000], 4160, 512, 128),  # N not a multiple of 128 (last tile starts mid-block); an all-padding tile
])
def test_gluon_grouped_contiguous(name, rows, n, k, tail):
    if name == "default":
        cfg = tuning.grouped_config(1 << 20, n, k)  # the Gluon config of large problems
        assert cfg["GLUON"]["BLOCK_N"] == 192
    else:
        cfg = {"GLUON": True, "GROUP_M": 8, **CONFIGS[name]}
    _grouped(cfg, *grouped_contiguous_operands(rows, n, k, "cuda", tail))
    if rows[0] % 128:  # out-of-range indices in the padding rows beside valid ones
        _grouped(cfg, *grouped_contiguous_operands(rows, n, k, "cuda", tail, stray=True))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("m,n,k", [(33, 7168, 2048), (64, 7168, 2048), (100, 7168, 2048), (128, 7168, 2048),
                                   (33, 2112, 7168), (64, 4096, 7168), (100, 2112, 7168), (128, 4096, 7168),
                                   (1, 7168, 2048), (16, 7168, 2048), (20, 7168, 2048), (1, 2112, 7168),
                                   (17, 2112, 7168), (32, 4096, 7168),  # M <= 32: A's short TMA box
                                   (1, 24576, 1536), (40, 24576, 1536), (16, 32768, 512), (128, 32768, 512),
                                   (40, 7168, 16384), (128, 7168, 16384)])
def test_auto_runs_gluon(m, n, k, monkeypatch):
    """backend="auto" runs the kernel ``tuning.GROUPWISE_GLUON`` names for the shape (at
    (m, 7168, 2048) the single-partition kernel, at (m, 2112 | 4096,
    7168) and (m, 7168, 16384) the K-interleaved one), both scale modes."""
    from mate import gemm
    from mate.ops.gemm import groupwise_gluon

    calls = []
    launch = groupwise_gluon.groupwise_gemm_gluon
    monkeypatch.setattr(groupwise_gluon, "groupwise_gemm_gluon", lambda *args, **kw: calls.append(
        (kernel_kind(kw["config"]), kw["config"]["BLOCK_M"])) or launch(*args, **kw))
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    for mode in ("K", "MN"):
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="auto")
        else:
            gemm.gemm_fp8_nt_groupwise(a, b, sa.t().contiguous(), sb.t().contiguous(), scale_major_mode="MN",
                                       out=out, backend="auto")
        assert_close(out, ref, max_rel_error=1e-2, name=f"auto m={m} {mode}")
    want = tuning.GROUPWISE_GLUON[f"{tuning.m_bucket(m)},{n},{k}"]
    assert calls == [(kernel_kind(want), want["BLOCK_M"])] * 2


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
def test_auto_follows_the_scale_layout(monkeypatch):
    """(128, 32768, 512): auto runs cuBLAS when it reads both scales in place (M-major
    activation scale, K-major weight scale), else the Gluon kernel (no scale re-layout)."""
    from mate import gemm
    from mate.ops.gemm import cublas, groupwise_gluon

    m, n, k = 128, 32768, 512
    calls = []
    for mod, name, tag in ((cublas, "groupwise_cublas", "cublas"), (groupwise_gluon, "groupwise_gemm_gluon", "gluon")):
        launch = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *args, _f=launch, _t=tag, **kw: calls.append(_t) or _f(*args, **kw))
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    sa_m_major = sa.t().contiguous().t()  # [m, kb] with stride (1, m)
    cases = {"K in place": (sa_m_major, sb, "K", "cublas"), "MN in place": (sa_m_major.t(), sb.t(), "MN", "cublas"),
             "K, K-major activation scale": (sa, sb, "K", "gluon"),
             "MN, MN-major weight scale": (sa_m_major.t(), sb.t().contiguous(), "MN", "gluon")}
    for name, (a_s, b_s, mode, want) in cases.items():
        calls.clear()
        out = poisoned((m, n), torch.bfloat16, "cuda")
        gemm.gemm_fp8_nt_groupwise(a, b, a_s, b_s, scale_major_mode=mode, out=out, backend="auto")
        assert_close(out, ref, max_rel_error=1e-2, name=name)
        assert calls == [want], (name, calls)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
def test_auto_kint_split_k_in_cuda_graph():
    """auto's K-interleaved split-K config (64, 2112, 7168): every replay of a captured call
    gives the eager call's bits and leaves the arrival counters at 0."""
    from mate import gemm
    from mate.ops.gemm import groupwise

    m, n, k = 64, 2112, 7168
    assert tuning.groupwise_config(m, n, k, fp8_out=False)["GLUON"]["SPLIT_K"] > 1
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    out = poisoned((m, n), torch.bfloat16, "cuda")
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="auto")
    torch.cuda.synchronize()
    first = out.clone()
    assert_close(first, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="auto")
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    assert all(int(c.count_nonzero()) == 0 for c in groupwise._COUNTERS.values())  # every stream's buffer


# two (four) K blocks per ring stage: half (a quarter of) the mbarrier waits/arrivals and their CTA barriers
KPS_CONFIGS = {
    "64x32 st8 kps2": {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 8, "KPS": 2},
    "64x64 st6 kps2": {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 6, "KPS": 2},
    "128x64 st4 kps2": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 4, "KPS": 2},
    "128x32 st5 kps2": {"BLOCK_M": 128, "BLOCK_N": 32, "num_stages": 5, "KPS": 2},
    "64x32 st4 kps4": {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 4, "KPS": 4},
}
KPS_GROUPED = {
    "128x192 st2 kps2 tma": {"BLOCK_N": 192, "num_stages": 2, "KPS": 2, "EPI_TMA": True},
    "128x128 st2 kps2 tma": {"BLOCK_N": 128, "num_stages": 2, "KPS": 2, "EPI_TMA": True},
}


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(KPS_CONFIGS))
@pytest.mark.parametrize("m,n,k", [
    (1, 256, 128),  # one K block: the only stage's other blocks reload it with zero scales
    (64, 2112, 1152),  # 9 K blocks (odd): a last stage with one block
    (100, 4160, 7168),  # 56 K blocks (even); N not a multiple of 128
])
def test_gluon_plain_kps(name, m, n, k):
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    for mode in ("K", "MN"):
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            _plain(a, b, sa, sb, out, KPS_CONFIGS[name])
        else:
            _plain(a, b, sa.t().contiguous().t(), sb.t().contiguous().t(), out, KPS_CONFIGS[name])
        assert_close(out, ref, max_rel_error=1e-2, name=f"{name} {mode}")


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(KPS_GROUPED))
@pytest.mark.parametrize("rows,n,k,tail", [
    ([300, 0, 128, 517], 4096, 1152, 0),  # padding rows, an empty group; 9 K blocks (odd)
    ([129, 1000], 4160, 1024, 128),  # 8 K blocks (even); N not a multiple of 128; an all-padding tile
    ([256, 128], 2112, 128, 0),  # one K block
])
def test_gluon_grouped_kps(name, rows, n, k, tail):
    _grouped({"GLUON": True, "GROUP_M": 8, "BLOCK_M": 128, **KPS_GROUPED[name]},
             *grouped_contiguous_operands(rows, n, k, "cuda", tail))


# ----------------------------------------------------------------------------- K-interleaved kernel
# (groupwise_gluon_kint.py: both math warpgroups own the tile, K blocks alternate between them)
KINT_CONFIGS = {
    "kint 64x16 st8 kps2": {"BLOCK_M": 64, "BLOCK_N": 16, "num_stages": 8, "KPS": 2},
    "kint 64x32 st16": {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 16},
    "kint 64x64 st6 kps2 s4": {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": 4},
    "kint 128x32 st4 kps2 s2": {"BLOCK_M": 128, "BLOCK_N": 32, "num_stages": 4, "KPS": 2, "SPLIT_K": 2},
    "kint 64x128 st2 kps3 s2 launch": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 2, "KPS": 3, "SPLIT_K": 2,
                                       "REDUCE": "launch"},
    # the next K block's wgmma issued before the last is scaled; 3 K blocks per stage
    "kint 64x64 st4 kps3 e": {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 4, "KPS": 3, "EAGER": True},
    "kint 128x64 st6 s4": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 6, "SPLIT_K": 4},
    # the last split waits for the others' partials (one unit per program; else as "fused")
    "kint 64x64 st6 kps2 s4 wait": {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": 4,
                                    "REDUCE": "wait"},
    "kint 64x32 st4 kps4 s2 e wait": {"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 4, "KPS": 4, "SPLIT_K": 2,
                                      "EAGER": True, "REDUCE": "wait"},
    # the configs backend="auto" picks at K = 7168 (tuning.GROUPWISE_GLUON)
    **auto_configs("kint"),
}


def _kint(a, b, sa, sb, out, cfg, num_sms=None):
    from mate.ops.gemm.groupwise_gluon import groupwise_gemm_gluon

    groupwise_gemm_gluon(a, b, sa, (0, sa.stride(0), sa.stride(1)), sb, (0, sb.stride(0), sb.stride(1)), out,
                         layout=PLAIN, config={"KINT": True, "GROUP_M": 8, **cfg}, num_sms=num_sms)


def test_kint_config_falls_back_off_hopper():
    """Off Hopper a KINT config runs the plain-Triton kernel (its SPLIT_K included)."""
    if _hopper():
        pytest.skip("covered by the GPU tests")
    a, b, sa, sb = fp8_block_operands(64, 192, 512)
    out = poisoned((64, 192), torch.bfloat16, "cpu")
    _plain(a, b, sa, sb, out, {**KINT_CONFIGS["kint 64x64 st6 kps2 s4"], "KINT": True})
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)


def test_kint_rejects_bad_configs():
    from mate.ops.gemm.groupwise_gluon import groupwise_gemm_gluon

    a, b, sa, sb = fp8_block_operands(64, 192, 256)
    out = torch.empty(64, 192, dtype=torch.bfloat16)
    bad = [({"BLOCK_M": 128, "BLOCK_N": 128}, "no 128x128 tile"), ({"BLOCK_M": 64, "BLOCK_N": 16, "KPS": 5}, "KPS"),
           ({"BLOCK_M": 64, "BLOCK_N": 16, "SPLIT_K": 0}, "SPLIT_K"),
           ({"BLOCK_M": 64, "BLOCK_N": 16, "num_stages": 3}, "even"),  # both warpgroups would read a slot
           ({"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 8, "KPS": 2}, "shared memory")]
    for cfg, msg in bad:
        with pytest.raises(ValueError, match=msg):
            _kint(a, b, sa, sb, out, cfg)
    with pytest.raises(ValueError, match="PLAIN"):
        groupwise_gemm_gluon(a, b, sa, (0, sa.stride(0), 1), sb, (0, sb.stride(0), 1), out, layout=CONTIGUOUS,
                             config={"KINT": True, "BLOCK_M": 64, "BLOCK_N": 16})


_KINT_SM90_BUILD = """
import json, sys
from triton.experimental.gluon._runtime import GluonASTSource
from mate.ops.gemm import groupwise_gluon_kint as gk
from mate.ops.gemm.groupwise_gluon import GLUON_MAX_REGS
from mate.testing.sass import compile_sm90, divisibility_attrs
from triton.experimental.gluon import language as gl

def desc(rows):
    layout = gl.NVMMASharedLayout.get_default_for([rows, 128], gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{rows}, 128],{layout}>"

for cfg in json.loads(sys.argv[1]):
    bm, bn, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg.get("SPLIT_K", 1)
    # A's TMA box at M = 1 (a_box_rows)
    sig = {"a_desc": desc(gk.a_box_rows(1, bm)), "b_desc": desc(bn), "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "c_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
           "stride_asm": "i32", "stride_ask": "i32", "stride_bsn": "i32", "stride_bsk": "i32", "stride_cm": "i32"}
    # M = 1 is a constexpr at launch (the GPU tests' M = 1 case)
    cx = {"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8, "STAGES": cfg["num_stages"], "KPS": cfg.get("KPS", 1),
          "SPLIT_K": split, "FUSED": split > 1 and cfg.get("REDUCE", "fused") != "launch",
          "WAIT": split > 1 and cfg.get("REDUCE") == "wait",
          "EAGER": cfg.get("EAGER", False), "M": 1}
    sig.update({c: "constexpr" for c in cx})
    rep = compile_sm90(GluonASTSource(fn=gk.fp8_groupwise_kint_kernel, signature=sig, constexprs=cx,
                                      attrs=divisibility_attrs(sig, ["as_ptr", "bs_ptr", "c_ptr", "ws_ptr", "K"])),
                       {"num_warps": 4, "maxnreg": GLUON_MAX_REGS})
    est = gk.kint_shared_bytes(bm, bn, cfg["num_stages"], cfg.get("KPS", 1), split)
    print(json.dumps(dict(cfg=cfg, shared=rep.shared, est=est, spills=rep.spills, mma=rep.sass.count("QGMMA"))))
"""


def test_kint_sm90_build():
    """Every K-interleaved config of the GPU tests compiles for sm_90 on the CPU (a child process
    without the interpreter) with M = 1 specialized, split configs with both reduces: no spills,
    shared memory within the launcher's bound and the SM's limit, QGMMA."""
    import json

    from mate.testing.sass import SMEM_LIMIT

    # split configs run the "wait" reduce when every unit has its own program and the fused one
    # otherwise: both builds
    builds = []
    for cfg in KINT_CONFIGS.values():
        if cfg.get("SPLIT_K", 1) > 1 and cfg.get("REDUCE", "wait") != "launch":
            builds += [{**cfg, "REDUCE": "wait"}, {**cfg, "REDUCE": "fused"}]
        else:
            builds.append(cfg)
    reps = sm90_build_reports(_KINT_SM90_BUILD, json.dumps(builds))
    assert len(reps) == len(builds)
    for rep in reps:
        assert rep["spills"] == 0 and rep["shared"] <= min(SMEM_LIMIT, rep["est"]) and rep["mma"] > 0, rep


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(KINT_CONFIGS))
@pytest.mark.parametrize("m,n,k", [
    (64, 2112, 7168),  # a measured shape
    (130, 200, 1152),  # partial row and column tiles, 9 K blocks (odd: a zero-scale block with KPS 2)
    (1, 320, 384),  # 3 K blocks: with 4 splits the last has none
    (17, 200, 1152),  # a 32-row A box (a_box_rows) with 15 rows past M
])
def test_kint_plain(name, m, n, k):
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    cfg = KINT_CONFIGS[name]
    for mode in ("K", "MN"):
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            _kint(a, b, sa, sb, out, cfg)
        else:
            _kint(a, b, sa.t().contiguous().t(), sb.t().contiguous().t(), out, cfg)
        assert_close(out, ref, max_rel_error=1e-2, name=f"{name} {mode}")
    first = out.clone()
    _kint(a, b, sa.t().contiguous().t(), sb.t().contiguous().t(), out, cfg)
    assert torch.equal(first.view(torch.int16), out.view(torch.int16))  # deterministic (split-K included)
    # persistent: more (tile, split) units than programs, several per program
    out = poisoned((m, n), torch.bfloat16, "cuda")
    _kint(a, b, sa, sb, out, cfg, num_sms=3)
    assert_close(out, ref, max_rel_error=1e-2, name=f"{name} 3 programs")


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("m,n,k", [(128, 2112, 7168), (130, 200, 1152), (1, 320, 384)])
def test_kint_wait_reduce_matches_fused(split, m, n, k):
    """REDUCE "wait" (the last split waits for the others' partials) gives the fused reduce's
    tiles bit for bit, over 200 back-to-back calls (the counters return to zero; a counter left
    off zero would hang or corrupt a later call), with 3 programs (more units than programs: it
    falls back to the fused reduce) and with an empty split (K blocks < splits at 3 K blocks)."""
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    base = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 6, "KPS": 2, "SPLIT_K": split, "EAGER": True}
    want = poisoned((m, n), torch.bfloat16, "cuda")
    _kint(a, b, sa, sb, want, {**base, "REDUCE": "fused"})
    assert_close(want, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2, name="fused")
    for num_sms in (None, 3):
        out = poisoned((m, n), torch.bfloat16, "cuda")
        for _ in range(200):
            _kint(a, b, sa, sb, out, {**base, "REDUCE": "wait"}, num_sms=num_sms)
        torch.cuda.synchronize()
        assert torch.equal(want.view(torch.int16), out.view(torch.int16)), num_sms


# the MASKED layout on the persistent kernel, as G * max_m rows (opt-in: no auto config yet)
MASKED_CONFIGS = {
    "masked 128x192 st4 tma": {"BLOCK_M": 128, "BLOCK_N": 192, "num_stages": 4, "EPI_TMA": True},
    "masked 128x128 st5 tma": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 5, "EPI_TMA": True},
    "masked 64x128 st6": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 6},
}


def _masked_operands(G, max_m, n, k, device):
    a = rand_fp8((G, max_m, k), device=device, scale=2.0)
    a_scale = torch.rand(G, max_m, k // 128, device=device) * 0.02 + 0.005
    b = rand_fp8((G, n, k), device=device, scale=2.0)
    b_scale = torch.rand(G, -(-n // 128), k // 128, device=device) * 0.02 + 0.005
    return a, a_scale, b, b_scale


def test_gluon_masked_supported():
    """The persistent kernel takes a MASKED call when each group is whole row tiles and the
    activation scales and output run group after group (no Hopper GPU needed)."""
    from mate.ops.gemm.groupwise_gluon import gluon_masked_supported

    a, a_scale, _, _ = _masked_operands(3, 256, 128, 256, "cpu")
    out = torch.empty(3, 256, 128, dtype=torch.bfloat16)
    k_major = tuple(a_scale.stride())
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128}
    assert gluon_masked_supported(a, k_major, out, cfg)
    assert gluon_masked_supported(a, k_major, out, {**cfg, "BLOCK_M": 64})
    assert not gluon_masked_supported(a[:, :192], k_major, out[:, :192], cfg)  # 192 rows: not whole 128-row tiles
    mn = torch.rand(3, 2, 256).transpose(1, 2)  # MN-major scales [G, max_m, kb] as a view
    assert not gluon_masked_supported(a, tuple(mn.stride()), out, cfg)
    assert not gluon_masked_supported(a, k_major, out.transpose(1, 2).contiguous().transpose(1, 2), cfg)
    assert not gluon_masked_supported(a, k_major, out, {**cfg, "FLAT": True})


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(MASKED_CONFIGS))
def test_gluon_masked(name):
    """Each group's first masked_m rows against the reference, every row past it left as it
    was (poisoned), and a CUDA graph replayed with new masked_m values."""
    from mate.ops.gemm.groupwise import MASKED
    from mate.ops.gemm.groupwise_gluon import groupwise_gemm_gluon
    from mate.testing.graphs import capture_graph

    G, max_m, n, k = 4, 256, 320, 384  # a partial 128-column block of weight scales
    a, a_scale, b, b_scale = _masked_operands(G, max_m, n, k, "cuda")
    cfg = {"GROUP_M": 8, **MASKED_CONFIGS[name]}
    masked_m = torch.tensor([0, max_m, 37, 200], dtype=torch.int32, device="cuda")  # empty, full, partial tiles
    out = poisoned((G, max_m, n), torch.bfloat16, "cuda")

    def run():
        groupwise_gemm_gluon(a, b, a_scale, tuple(a_scale.stride()), b_scale, tuple(b_scale.stride()), out,
                             layout=MASKED, config=cfg, masked_m=masked_m)

    def check():
        ref = R.masked_ref(a, b, a_scale, b_scale, masked_m, torch.float32)
        for g, cnt in enumerate(masked_m.tolist()):
            assert_close(out[g, :cnt], ref[g, :cnt], name=f"{name} group {g}")
            assert bool(torch.isnan(out[g, cnt:].float()).all()), f"{name}: group {g} rows past masked_m written"

    run()
    check()
    graph = capture_graph(run)
    masked_m.copy_(torch.tensor([max_m, 1, 128, 0], dtype=torch.int32))
    out.copy_(poisoned((G, max_m, n), torch.bfloat16, "cuda"))
    graph.replay()
    check()
