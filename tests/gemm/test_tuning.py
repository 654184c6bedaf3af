"""The auto table and the cuBLAS eligibility rules (pure Python, no kernels)."""

from __future__ import annotations

import torch

from mate.ops.gemm import cublas, tuning


def test_m_buckets_and_table_cover_every_m():
    for m in (1, 16, 17, 64, 65, 128, 129, 4096, 4097, 1 << 20):
        key = tuning.m_bucket(m)
        assert key in tuning.GROUPWISE_TABLE
        assert tuning.groupwise_backend(m, 2112, 7168) in ("cublas", "triton")
    assert tuning.m_bucket(16) == "m16" and tuning.m_bucket(17) == "m32" and tuning.m_bucket(1 << 20) == "mmax"
    # measured: small M goes to Triton, large M to cuBLAS, (128, 32768, 512) to cuBLAS unless
    # cuBLAS would re-lay a scale out (then the Gluon kernel, which reads either layout in place)
    assert tuning.groupwise_backend(64, 2112, 7168) == "triton"
    assert tuning.groupwise_backend(4096, 4096, 7168) == "cublas"
    assert tuning.groupwise_backend(128, 24576, 1536) == "triton"
    assert tuning.groupwise_backend(128, 32768, 512) == "cublas"
    assert tuning.groupwise_backend(128, 32768, 512, scales_in_place=False) == "triton"
    for m, n, k in ((256, 32768, 512), (4096, 4096, 7168), (128, 4096, 7168)):
        assert tuning.groupwise_backend(m, n, k, scales_in_place=False) == tuning.groupwise_backend(m, n, k)


def test_groupwise_scales_in_place():
    """cuBLAS reads the activation scale M-major and the weight scale as the transpose of a
    K-major [nb, kb]; any other layout would be copied first."""
    from mate.ops.gemm.cublas import groupwise_scales_in_place

    m, kb, nb = 128, 4, 256
    a_m_major = torch.rand(kb, m).t()  # [m, kb] view, stride (1, m)
    b_k_major = torch.rand(nb, kb)  # the checkpoint layout; cuBLAS takes its transpose
    assert groupwise_scales_in_place(a_m_major, b_k_major.t())
    assert not groupwise_scales_in_place(torch.rand(m, kb), b_k_major.t())  # K-major activation scale
    assert not groupwise_scales_in_place(a_m_major, torch.rand(kb, nb))  # MN-major weight scale


def test_split_k_only_when_tiles_do_not_fill_the_gpu():
    assert tuning.groupwise_config(64, 2112, 7168, fp8_out=False)["SPLIT_K"] > 1
    assert tuning.groupwise_config(4096, 4096, 7168, fp8_out=False)["SPLIT_K"] == 1
    assert tuning.groupwise_config(64, 2112, 512, fp8_out=False)["SPLIT_K"] == 1  # 4 k-blocks only
    assert tuning.groupwise_config(64, 2112, 7168, fp8_out=True)["BLOCK_N"] == 128
    # one wave of programs: 33 tiles of 64x64 -> 4 splits (132), 64 tiles -> 2 (128)
    for n, splits in ((2112, 4), (4096, 2)):
        cfg = tuning.groupwise_config(64, n, 7168, fp8_out=False)
        tiles = -(-64 // cfg["BLOCK_M"]) * -(-n // cfg["BLOCK_N"])
        assert cfg["SPLIT_K"] == splits and tiles * splits <= tuning.NUM_SMS


def test_stages_follow_the_k_loop_length():
    assert tuning.groupwise_config(64, 24576, 1536, fp8_out=False)["num_stages"] == 4  # 12 K blocks
    assert tuning.groupwise_config(64, 2112, 7168, fp8_out=False)["num_stages"] == 5  # 56 / 4 splits
    assert tuning.groupwise_config(128, 7168, 16384, fp8_out=False)["num_stages"] == 6  # 128, no split
    assert tuning.groupwise_config(64, 7168, 2048, fp8_out=False)["num_stages"] == 5  # 16, no split
    # 2 splits of 28 K blocks take 6 stages (measured at M = 64: 14.2 us vs 15.0 with 5)
    cfg = tuning.groupwise_config(64, 4096, 7168, fp8_out=False)
    assert (cfg["BLOCK_N"], cfg["SPLIT_K"], cfg["num_stages"]) == (64, 2, 6)
    # measured override: two waves of 64x64 programs (2 splits of 28 K blocks)
    cfg = tuning.groupwise_config(128, 4096, 7168, fp8_out=False)
    assert (cfg["BLOCK_N"], cfg["SPLIT_K"], cfg["num_stages"]) == (64, 2, 6)
    assert tuning.groupwise_config(128, 24576, 1536, fp8_out=False)["num_stages"] == 3  # 3 CTAs per SM
    assert tuning.groupwise_config(4096, 4096, 7168, fp8_out=False)["num_stages"] <= 4  # the entry caps it


def test_bmm_fp8_backend_and_cublas_rules():
    assert tuning.bmm_fp8_backend(1, 4096, 4096, 4096) == "cublas"
    assert tuning.bmm_fp8_backend(8, 512, 512, 4096) == "triton"
    a = torch.empty(1, 256, dtype=torch.float8_e4m3fn)
    b = torch.empty(128, 256, dtype=torch.float8_e4m3fn)
    out = torch.empty(1, 128, dtype=torch.bfloat16)
    assert "m a positive multiple of 16" in cublas.groupwise_cublas_reason(a, b, out)
    a = torch.empty(64, 512, dtype=torch.float8_e4m3fn)
    b = torch.empty(128, 512, dtype=torch.float8_e4m3fn)
    assert cublas.groupwise_cublas_reason(a, b, torch.empty(64, 128, dtype=torch.bfloat16)) is None
    assert "bf16 only" in cublas.groupwise_cublas_reason(a, b, torch.empty(64, 128, dtype=torch.float16))
    A = torch.empty(2, 16, 32, dtype=torch.float8_e4m3fn)
    B_col = torch.empty(2, 48, 32, dtype=torch.float8_e4m3fn).transpose(1, 2)
    o = torch.empty(2, 16, 48, dtype=torch.bfloat16)
    assert cublas.bmm_fp8_cublas_reason(A, B_col, o, per_tensor=True) is None
    assert "column-major" in cublas.bmm_fp8_cublas_reason(A, B_col.contiguous(), o, per_tensor=True)
    assert "channelwise" in cublas.bmm_fp8_cublas_reason(A, B_col, o, per_tensor=False)


def test_scale_modes_map_to_cublas_layouts():
    """gemm_fp8_nt_groupwise's view of the scales cuBLAS would get, in both major modes:
    in place when the activation scale is M-major and the weight scale K-major."""
    from mate.gemm import _cublas_reads_scales_in_place

    m, kb, nb = 64, 4, 8
    sa_m_major = torch.rand(kb, m)  # [kb, m]: "MN" mode as given, or its .t() view in "K" mode
    sb_k_major = torch.rand(nb, kb)  # [nb, kb]: "K" mode as given, or its .t() view in "MN" mode
    assert _cublas_reads_scales_in_place(sa_m_major.t(), sb_k_major, "K")
    assert _cublas_reads_scales_in_place(sa_m_major, sb_k_major.t(), "MN")
    assert not _cublas_reads_scales_in_place(torch.rand(m, kb), sb_k_major, "K")
    assert not _cublas_reads_scales_in_place(sa_m_major, torch.rand(kb, nb), "MN")


def test_fp8_out_two_step_rule():
    """The two-step FP8 output: always behind cuBLAS, at M <= 128 only on the measured shapes,
    never on an unlisted one."""
    assert tuning.fp8_out_two_step(4096, 24576, 1536, "cublas")
    assert tuning.fp8_out_two_step(128, 2112, 7168, "triton") and tuning.fp8_out_two_step(64, 7168, 2048, "triton")
    assert not tuning.fp8_out_two_step(128, 7168, 16384, "triton")
    assert not tuning.fp8_out_two_step(64, 24576, 1536, "triton")
    assert not tuning.fp8_out_two_step(64, 1000, 7168, "triton")
    for key in tuning.FP8_OUT_TWO_STEP:
        bucket, n, k = key.split(",")
        assert bucket in {f"m{b}" for b in tuning.M_BUCKETS} and int(k) % 128 == 0 and int(n) > 0
