"""msa(): bad or unsupported inputs raise instead of giving a wrong answer (CPU reference;
the checks run before any kernel)."""

from __future__ import annotations

import pytest
import torch

from mate.msa_interface import MsaRuntimeMetadata, _msa_plan_from_lengths, msa, msa_plan


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


def test_causal_dense_custom_offset_is_not_silently_ignored():
    """Causal dense attention implements only the default offset (kv_len - q_len): a tensor
    override and a static plan's runtime qo_offset raise like the int override."""
    q, k, v = _bf16(4, 2, 64), _bf16(8, 2, 64), _bf16(8, 2, 64)
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2)
    msa(q, k, v, info)  # the default offset runs
    for override in (_i32([0]), 0):
        with pytest.raises(NotImplementedError, match="qo_offset other than kv_len - q_len"):
            msa(q, k, v, info, q_offset_override=override)
    static = msa_plan(1, 4, 8, 2)
    rt = MsaRuntimeMetadata(qo_lens=_i32([4]), kv_lens=_i32([8]), qo_offset=_i32([0]), cu_seqlens_q=_i32([0, 4]),
                            cu_seqlens_k=_i32([0, 8]), seqused_k=_i32([8]))
    with pytest.raises(NotImplementedError, match="qo_offset other than kv_len - q_len"):
        msa(q, k, v, static, runtime_metadata=rt)


def _sparse_static_case():
    info = msa_plan(2, 4, 384, 4, num_kv_heads=2, page_size=128, kv_block_num=4, sparse_kernel_mode="prefill")
    cache = _bf16(6, 128, 2, 128)
    q = _bf16(8, 4, 128)
    idx = torch.full((8, 2, 4), -1, dtype=torch.int32)
    idx[:, :, 0] = 0
    rt = MsaRuntimeMetadata(_i32([3, 2]), _i32([300, 140]), None, cu_seqlens_q=_i32([0, 3, 5]),
                            cu_seqlens_k=_i32([0, 300, 440]), seqused_k=_i32([300, 140]),
                            page_table=_i32([[4, 1, 3], [0, 5, 0]]))
    return info, cache, q, idx, rt


def test_check_input_valid_on_a_static_plan_skips_its_spare_rows(monkeypatch):
    """Rows past cu_seqlens_q[-1] (a static plan's capacity) are not checked; an id past a
    request's blocks raises ValueError, also with MATE_CHECK_INPUTS=1 instead of the flag."""
    info, cache, q, idx, rt = _sparse_static_case()
    idx[6:, :, 1] = 99  # spare rows: never read
    msa(q, cache, cache, info, kv_block_indexes=idx, runtime_metadata=rt, check_input_valid=True)
    idx[4, 1, 2] = 2  # request 1 has 2 blocks (140 keys)
    with pytest.raises(ValueError, match=r"kv_block_indexes must hold -1 or a valid block id \(< 2 .*got 2"):
        msa(q, cache, cache, info, kv_block_indexes=idx, runtime_metadata=rt, check_input_valid=True)
    msa(q, cache, cache, info, kv_block_indexes=idx, runtime_metadata=rt)  # skipped by the kernel, no check
    monkeypatch.setenv("MATE_CHECK_INPUTS", "1")
    with pytest.raises(ValueError, match="kv_block_indexes must hold -1 or a valid block id"):
        msa(q, cache, cache, info, kv_block_indexes=idx, runtime_metadata=rt)


def test_short_kv_indices_raise():
    """Flat kv_indices with fewer entries than the plan's pages raise (they used to be padded
    with the last entry, reading another page), for max-score and attention alike."""
    q, cache = _bf16(2, 2, 128), _bf16(3, 128, 1, 128)
    info = _msa_plan_from_lengths(torch.tensor([2]), torch.tensor([256]), 2, 1, page_size=128, output_maxscore=True)
    with pytest.raises(ValueError, match=r"kv_indices must be at least 2 entries .*got '1 entries'"):
        msa(q, cache, None, info, kv_indices=_i32([0]), output_o=False)
    with pytest.raises(ValueError, match="kv_indices must be at least 2 entries"):
        msa(q, cache, cache, info, kv_indices=_i32([0]), output_maxscore=False)
    msa(q, cache, cache, info, kv_indices=_i32([2, 0]))


def test_fp8_dense_and_paged_plans_are_not_implemented():
    q = _bf16(4, 2, 64).to(torch.float8_e4m3fn)
    k = _bf16(8, 2, 64).to(torch.float8_e4m3fn)
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn q / k / v are implemented for sparse plans only"):
        msa(q, k, k, info)


def test_overlapping_out_raises():
    q, k, v = _bf16(4, 2, 64), _bf16(8, 2, 64), _bf16(8, 2, 64)
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2)
    out = torch.empty(1, 2, 64, dtype=torch.bfloat16).expand(4, 2, 64)
    with pytest.raises(ValueError, match="out must not overlap itself"):
        msa(q, k, v, info, out=out)
    lse = torch.empty(1, 2).expand(4, 2)
    with pytest.raises(ValueError, match="lse must not overlap itself"):
        msa(q, k, v, info, lse=lse)
    # outputs sharing memory with an input: q, or the page table the kernels read
    info_ms = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2, output_maxscore=True)
    with pytest.raises(ValueError, match="max_score must not overlap q"):
        msa(q, k, v, info_ms, max_score=q.view(-1).view(torch.float32)[:8].view(4, 2, 1))
    qp, kp = _bf16(4, 2, 128), _bf16(1, 128, 2, 128)
    info_p = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2, page_size=128)
    out = torch.empty(4, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out must not overlap page_table"):
        msa(qp, kp, kp, info_p, out=out, page_table=out.view(-1).view(torch.int32)[:1].view(1, 1))


def test_sparse_entry_points_take_their_own_plan_and_outputs_only():
    """sparse_msa takes a single sparse_prefill plan, sparse_decode_atten_func a single
    sparse_decode plan; msa()'s output-selection keywords are not theirs."""
    from mate.msa_interface import sparse_decode_atten_func, sparse_msa, sparse_msa_plan

    q, cache = _bf16(2, 2, 128), _bf16(2, 128, 1, 128)
    table = _i32([[1, 0]])
    blocks = _i32([0, 1, -1, -1]).expand(2, 1, 4).contiguous()
    prefill = sparse_msa_plan(torch.tensor([2]), torch.tensor([256]), num_qo_heads=2, num_kv_heads=1, kv_block_num=4)
    decode = _msa_plan_from_lengths(torch.tensor([1, 1]), torch.tensor([256, 200]), 2, 1, page_size=128,
                                    kv_block_num=4, sparse_kernel_mode="decode")
    dense = _msa_plan_from_lengths(torch.tensor([2]), torch.tensor([256]), num_qo_heads=2, num_kv_heads=1)
    out, none = sparse_msa(q, cache, cache, prefill, kv_block_indexes=blocks, page_table=table)
    assert none is None and out.shape == (2, 2, 128)
    for info, mode in ((decode, "sparse_decode"), (dense, "dense")):
        with pytest.raises(ValueError, match=f"plan_info must be a single sparse_prefill plan, got mode '{mode}'"):
            sparse_msa(q, cache, cache, info, kv_block_indexes=blocks, page_table=table)
    with pytest.raises(ValueError, match="plan_info must be a single sparse_decode plan, got mode 'sparse_prefill'"):
        sparse_decode_atten_func(q, cache, cache, prefill, page_table=table, kv_block_indexes=blocks)
    with pytest.raises(TypeError, match="plan_info must be an MsaPlanInfo, got dict"):
        sparse_msa(q, cache, cache, {}, kv_block_indexes=blocks)
    for key, value in (("output_o", False), ("output_maxscore", True), ("max_score", torch.empty(1))):
        with pytest.raises(TypeError, match=f"sparse_msa\\(\\) got an unexpected keyword argument '{key}'"):
            sparse_msa(q, cache, cache, prefill, kv_block_indexes=blocks, page_table=table, **{key: value})
        unexpected = f"sparse_decode_atten_func\\(\\) got an unexpected keyword argument '{key}'"
        with pytest.raises(TypeError, match=unexpected):
            sparse_decode_atten_func(q, cache, cache, decode, page_table=table.expand(2, 2).contiguous(),
                                     kv_block_indexes=blocks, **{key: value})
    with pytest.raises(TypeError, match="return_softmax_lse must be a bool, got int"):
        sparse_decode_atten_func(q, cache, cache, decode, page_table=table.expand(2, 2).contiguous(),
                                 kv_block_indexes=blocks, return_softmax_lse=1)
    out, lse = sparse_decode_atten_func(q, cache, cache, decode, page_table=table.expand(2, 2).contiguous(),
                                        kv_block_indexes=blocks, return_softmax_lse=True)
    assert out.shape == (2, 2, 128) and lse.shape == (2, 2) and lse.dtype == torch.float32


def test_static_plan_q_over_capacity_and_empty_cache_raise(device):
    from mate.msa_interface import sparse_msa, sparse_msa_plan

    info = msa_plan(1, 1, 6, 2)
    q = torch.zeros(3, 2, 64, dtype=torch.bfloat16, device=device)
    k = torch.zeros(6, 2, 64, dtype=torch.bfloat16, device=device)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=i32(0, 3), cu_seqlens_k=i32(0, 6), seqused_k=i32(6))
    with pytest.raises(ValueError, match=r"q must be \[<= 1 \(the plan's batch_size \* max_seqlen_q\)"):
        msa(q, k, k, info, runtime_metadata=rt)
    sp = sparse_msa_plan(torch.tensor([4]), torch.tensor([256]), num_qo_heads=2, num_kv_heads=1, kv_block_num=4)
    qs = torch.zeros(4, 2, 128, dtype=torch.bfloat16, device=device)
    empty = torch.zeros(0, 128, 1, 128, dtype=torch.bfloat16, device=device)
    blocks = i32(0, 1, -1, -1).expand(4, 1, 4).contiguous()
    with pytest.raises(ValueError, match=r"k.shape\[0\] \(pages\) must be at least 1"):
        sparse_msa(qs, empty, empty, sp, kv_block_indexes=blocks, page_table=i32(1, 0).view(1, 2))


def test_int32_overflowing_host_values_raise():
    from mate.msa_interface import build_page_table_from_flat_kv_indices, sparse_msa, sparse_msa_plan

    with pytest.raises(ValueError, match="qo_offset must be int32 values"):
        _msa_plan_from_lengths(torch.tensor([1]), torch.tensor([6]), num_qo_heads=2, qo_offset=torch.tensor([2**32]))
    with pytest.raises(ValueError, match="kv_lens must be int32 values"):
        _msa_plan_from_lengths(torch.tensor([1]), torch.tensor([2**32 + 6]), num_qo_heads=2)
    with pytest.raises(ValueError, match="max_seqlen_k must be < 2"):
        msa_plan(1, 1, 2**40, 2)
    with pytest.raises(ValueError, match="kv_indices must be int32 page ids"):
        build_page_table_from_flat_kv_indices(torch.tensor([5, 2**32 + 3]), [200], 128)
    with pytest.raises(TypeError, match="kv_lens must be an integer tensor or a list of ints"):
        build_page_table_from_flat_kv_indices(torch.tensor([5]), None, 128)
    with pytest.raises(TypeError, match="kv_lens must be a list of ints"):
        build_page_table_from_flat_kv_indices(torch.tensor([5]), [1.5], 128)
    sp = sparse_msa_plan(torch.tensor([4]), torch.tensor([256]), num_qo_heads=2, num_kv_heads=1, kv_block_num=4)
    q = torch.zeros(4, 2, 128, dtype=torch.bfloat16)
    kc = torch.zeros(2, 128, 1, 128, dtype=torch.bfloat16)
    blocks = torch.tensor([0, 1, -1, -1], dtype=torch.int32).expand(4, 1, 4).contiguous()
    with pytest.raises(ValueError, match="q_offset_override must be an int32 value"):
        sparse_msa(q, kc, kc, sp, kv_block_indexes=blocks, page_table=torch.tensor([[0, 1]], dtype=torch.int32),
                   q_offset_override=2**40)


def test_planner_device_and_int_offset_are_checked():
    with pytest.raises(ValueError, match="device must be a torch.device or a device string, got 'bogus'"):
        _msa_plan_from_lengths(torch.tensor([1]), torch.tensor([6]), num_qo_heads=2, device="bogus")
    with pytest.raises(ValueError, match="qo_offset must be an int32 value"):
        _msa_plan_from_lengths(torch.tensor([1]), torch.tensor([6]), num_qo_heads=2, qo_offset=2**40)


def test_shape_errors_name_the_argument():
    """The shape checks of msa() and of the sparse forward (each message built only when it
    fails): q's heads, k's head dim, v's shape, the heads ratio, the block lists' heads and
    width, a misaligned cache."""
    from mate.ops.msa.sparse_attention import sparse_attention

    q, k, v = _bf16(4, 2, 64), _bf16(8, 2, 64), _bf16(8, 2, 64)
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2)
    with pytest.raises(ValueError, match=r"q must be \[total_q, 2 \(num_qo_heads\), D\], got \[4, 3, 64\]"):
        msa(_bf16(4, 3, 64), k, v, info)
    with pytest.raises(ValueError, match=r"k must be head dim 64 \(q's\), got \[8, 2, 32\]"):
        msa(q, _bf16(8, 2, 32), v, info)
    with pytest.raises(ValueError, match=r"v must be shape \[8, 2\] \+ \[Dv\], got \[8, 1, 64\]"):
        msa(q, k, _bf16(8, 1, 64), info)

    cache = _bf16(3, 128, 2, 128)
    qs = _bf16(4, 4, 128)
    idx = torch.zeros(4, 2, 4, dtype=torch.int32)
    kw = dict(page_table=_i32([[0, 1, 2]]), qo_indptr=_i32([0, 4]), kv_lens=_i32([300]))
    sparse_attention(qs, cache, cache, kv_block_indexes=idx, **kw)  # the valid call runs
    with pytest.raises(ValueError, match=r"q.shape\[1\] \(num_qo_heads\) must be a multiple of num_kv_heads=2, got 3"):
        sparse_attention(_bf16(4, 3, 128), cache, cache, kv_block_indexes=idx, **kw)
    with pytest.raises(ValueError, match=r"kv_block_indexes.shape\[1\] must be num_kv_heads=2 or num_qo_heads=4"):
        sparse_attention(qs, cache, cache, kv_block_indexes=torch.zeros(4, 3, 4, dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match=r"kv_block_indexes.shape\[2\] \(width\) must be in \[1, 64\], got 65"):
        sparse_attention(qs, cache, cache, kv_block_indexes=torch.zeros(4, 2, 65, dtype=torch.int32), **kw)
    shifted = _bf16(3 * 128 * 2 * 128 + 1).view(-1)[1:].view(3, 128, 2, 128)  # 2 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match=r"k \(address and strides\) must be 16-byte aligned, got 'data_ptr % 16 = "):
        sparse_attention(qs, shifted, cache, kv_block_indexes=idx, **kw)


def test_sparse_msa_checks_what_the_sparse_forward_needs():
    """msa() runs the sparse forward without its own checks, so msa() rejects what the kernels
    cannot read: a head dim other than 128, V's head dim different from K's, a cache without
    pages or of another layout, k / v not 16-byte aligned (TMA)."""
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([300]), num_qo_heads=4, num_kv_heads=2,
                                  page_size=128, kv_block_num=4)
    cache, q = _bf16(3, 128, 2, 128), _bf16(4, 4, 128)
    idx = torch.zeros(4, 2, 4, dtype=torch.int32)
    pt = _i32([[0, 1, 2]])
    out, _ = msa(q, cache, cache, info, kv_block_indexes=idx, page_table=pt)  # the valid call runs
    assert torch.isfinite(out.float()).all()
    with pytest.raises(ValueError, match=r"q.shape\[2\] \(head_dim\) must be 128 for sparse MSA, got 64"):
        msa(_bf16(4, 4, 64), _bf16(3, 128, 2, 64), _bf16(3, 128, 2, 64), info, kv_block_indexes=idx, page_table=pt)
    with pytest.raises(ValueError, match=r"v must be head dim 128 \(q's\) for sparse MSA, got \[3, 128, 2, 64\]"):
        msa(q, cache, _bf16(3, 128, 2, 64), info, kv_block_indexes=idx, page_table=pt)
    with pytest.raises(ValueError, match=r"k.shape\[0\] \(pages\) must be at least 1, got 0"):
        msa(q, _bf16(0, 128, 2, 128), _bf16(0, 128, 2, 128), info, kv_block_indexes=idx, page_table=pt)
    with pytest.raises(ValueError, match=r"k must be paged \[num_pages, 128, 2, D\] or \[num_pages, 2, 128, D\]"):
        msa(q, _bf16(3, 64, 2, 128), _bf16(3, 64, 2, 128), info, kv_block_indexes=idx, page_table=pt)
    shifted = _bf16(3 * 128 * 2 * 128 + 1).view(-1)[1:].view(3, 128, 2, 128)  # 2 bytes past a 16-byte boundary
    for name, k, v in (("k", shifted, cache), ("v", cache, shifted)):
        with pytest.raises(ValueError, match=rf"{name} \(address and strides\) must be 16-byte aligned"):
            msa(q, k, v, info, kv_block_indexes=idx, page_table=pt)
    padded = _bf16(3, 128, 2, 136)[..., :128]  # 272-byte rows: strided and aligned, read in place
    out2, _ = msa(q, padded, padded, info, kv_block_indexes=idx, page_table=pt)
    ref, _ = msa(q, padded.contiguous(), padded.contiguous(), info, kv_block_indexes=idx, page_table=pt)
    torch.testing.assert_close(out2, ref, rtol=0, atol=0)


def test_output_flags_must_be_bool():
    q, k, v = _bf16(4, 2, 64), _bf16(8, 2, 64), _bf16(8, 2, 64)
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([8]), num_qo_heads=2)
    with pytest.raises(TypeError, match="output_o must be a bool, got int"):
        msa(q, k, v, info, output_o=1)
    with pytest.raises(TypeError, match="output_maxscore must be a bool, got int"):
        msa(q, k, v, info, output_maxscore=0)
