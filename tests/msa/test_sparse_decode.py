"""The transposed MSA sparse decode kernel (``sparse_decode.DECODE_VARIANT['kernel'] =
'transposed'``) against the reference: CPU interpreter on small shapes, GPU at MiniMax-M3
geometry."""

from __future__ import annotations

import pytest
import torch

from mate.ops.msa import sparse_decode as sd
from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.ops.msa.sparse_attention import sparse_attention
from mate.testing import assert_close, poisoned
from tests._markers import interpreter_only
from tests.msa.test_sparse_attention import TOL, assert_lse_close, make_problem, run_case


@pytest.fixture
def transposed(monkeypatch):
    monkeypatch.setitem(sd.DECODE_VARIANT, "kernel", "transposed")


def _check(o, l_, ro, rl, dtype):
    atol, rtol = TOL[dtype]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_lse_close(l_, rl, dtype, o.device)


# dtype, ratio, layout, splits, keys per tile, flat page list, non-contiguous cache
CASES = [
    (torch.bfloat16, 16, "NHD", 1, 64, False, False),
    (torch.bfloat16, 16, "HND", 2, 128, True, False),
    (torch.float16, 4, "NHD", 2, 64, False, False),  # ratio < 16: padded head columns
    (torch.float16, 32, "HND", 1, 128, False, False),
    (torch.float8_e4m3fn, 16, "NHD", 2, 64, False, False),
    (torch.float8_e4m3fn, 16, "HND", 1, 128, False, False),
    (torch.float8_e4m3fn, 8, "HND", 2, 64, True, True),  # 4D descriptors of a strided cache
    (torch.bfloat16, 16, "NHD", 1, 128, False, True),
]


@pytest.mark.parametrize("dtype,ratio,layout,splits,keys,flat,strided", CASES)
def test_transposed_decode_matches_reference(device, triton_backend, transposed, monkeypatch, dtype, ratio, layout,
                                             splits, keys, flat, strided):
    monkeypatch.setitem(sd.DECODE_VARIANT, "keys", keys)
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_keys", keys)
    pb = make_problem([1, 0, 2], [300, 50, 129], hq=ratio, hkv=1, width=8, dtype=dtype, device=device,
                      layout=layout, flat=flat)
    if strided:  # every other page of a cache twice as large: not contiguous, 16-byte aligned
        for name in ("k", "v"):
            big = torch.zeros((2 * pb[name].shape[0], *pb[name].shape[1:]), dtype=dtype, device=device)
            big[::2] = pb[name]
            pb[name] = big[::2]
            assert not pb[name].is_contiguous()
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, sm_scale=scale[0], k_scale=scale[1],
                             v_scale=scale[2], strided=splits == 2)
    _check(o, l_, ro, rl, dtype)


# layout, splits, lazy threshold, flat page list, non-contiguous cache, GQA ratio
FP8_V_CASES = [("NHD", 1, 8, False, False, 8), ("HND", 2, 0, True, False, 16), ("NHD", 2, 1, False, True, 32)]


@pytest.mark.parametrize("fp8_v", ["mma", "gather"])
@pytest.mark.parametrize("layout,splits,lazy,flat,strided,ratio", FP8_V_CASES)
def test_transposed_decode_fp8_v_paths(device, triton_backend, transposed, monkeypatch, fp8_v, layout, splits, lazy,
                                       flat, strided, ratio):
    """e4m3 caches: Vᵀ made by the identity wgmma (``fp8_v="mma"``, V read as two column halves)
    or gathered and widened in registers ("gather"), against the reference; GQA ratios 8 (head
    columns padded to 16), 16 and 32 (which gathers either way)."""
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_v", fp8_v)
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_lazy", lazy)
    dtype = torch.float8_e4m3fn
    pb = make_problem([1, 0, 2, 1], [300, 50, 129, 700], hq=2 * ratio, hkv=2, width=8, dtype=dtype, device=device,
                      layout=layout, flat=flat)
    if strided:
        for name in ("k", "v"):
            big = torch.zeros((2 * pb[name].shape[0], *pb[name].shape[1:]), dtype=dtype, device=device)
            big[::2] = pb[name]
            pb[name] = big[::2]
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, sm_scale=0.05, k_scale=2.0, v_scale=0.25)
    _check(o, l_, ro, rl, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits", [1, 2])
def test_fp8_v_paths_bit_identical_gpu(transposed, monkeypatch, layout, splits):
    """M3 geometry: the identity wgmma gives the same fp16 Vᵀ as the byte gather, and the P·V
    wgmmas run in the same order, so the two paths' outputs agree bit for bit."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(9)]
    pb = make_problem([1] * 9, kv_lens, hq=64, hkv=4, width=17, dtype=torch.float8_e4m3fn, device="cuda",
                      layout=layout)
    res = {}
    for path in ("mma", "gather"):
        monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_v", path)
        res[path] = run_case("cuda", pb, decode=True, splits=splits, sm_scale=0.05, k_scale=2.0, v_scale=0.25)
    (o1, l1, ro, rl), (o2, l2, _, _) = res["mma"], res["gather"]
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    _check(o1, l1, ro, rl, torch.float8_e4m3fn)


# dtype, lazy threshold (0: rescaled every tile), sm_scale (a large one spreads the logits: the
# reference max rises often), splits
LAZY_CASES = [
    (torch.float8_e4m3fn, 1, 0.5, 1),
    (torch.float8_e4m3fn, 0, 0.5, 2),
    (torch.bfloat16, 2, 0.5, 2),
    (torch.bfloat16, 0, None, 1),
]


@pytest.mark.parametrize("dtype,lazy,sm_scale,splits", LAZY_CASES)
def test_transposed_decode_lazy_rescale(device, triton_backend, transposed, monkeypatch, dtype, lazy, sm_scale,
                                        splits):
    """``lazy``: the softmax keeps its reference max until a logit exceeds it by ``lazy`` (0:
    the plain online softmax; the other tests run the default, 8)."""
    monkeypatch.setitem(sd.DECODE_VARIANT, "lazy", lazy)
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_lazy", lazy)
    pb = make_problem([1, 0, 2], [300, 50, 640], hq=16, hkv=1, width=8, dtype=dtype, device=device)
    scale = (sm_scale, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (sm_scale, 1.0, 1.0)
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, sm_scale=scale[0], k_scale=scale[1],
                             v_scale=scale[2])
    _check(o, l_, ro, rl, dtype)


@pytest.mark.parametrize("splits,lazy", [(1, 8), (2, 8), (1, 0)])
def test_transposed_decode_empty_and_invalid_selections(device, triton_backend, transposed, monkeypatch, splits,
                                                        lazy):
    monkeypatch.setitem(sd.DECODE_VARIANT, "lazy", lazy)
    pb = make_problem([1, 1, 1], [384, 384, 200], hq=16, hkv=1, width=4, device=device)
    idx = pb["kv_block_indexes"]
    idx.fill_(-1)  # token 0: nothing selected
    idx[1, 0] = torch.tensor([9, -1, 3, 7])  # token 1: only out-of-range ids
    idx[2, 0, 2] = 1  # token 2: one block, partly causal
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits)
    _check(o, l_, ro, rl, torch.bfloat16)
    assert (o[:2].float() == 0).all() and torch.isinf(l_[:2]).all() and (l_[:2] < 0).all()
    assert torch.isfinite(l_[2]).all()


@pytest.mark.parametrize("lazy", [8, 0])
def test_transposed_decode_lazy_huge_logits(device, triton_backend, transposed, monkeypatch, lazy):
    """Logits near 2^27 (log2 units), where fp32 rounds m + 8 to m + 16: the second 64-key
    tile's logit is 16 above the first's, so a test of ``s > m_i + LAZY`` keeps the reference
    max and p = 2^16 overflows fp16 P (an inf output)."""
    monkeypatch.setitem(sd.DECODE_VARIANT, "lazy", lazy)
    monkeypatch.setitem(sd.DECODE_VARIANT, "keys", 64)
    pb = make_problem([1], [128], hq=16, hkv=1, width=4, dtype=torch.float16, device=device, seed=1)
    pb["kv_block_indexes"][:] = torch.tensor([0, -1, -1, -1], dtype=torch.int32, device=device)
    q, k = pb["q"], pb["k"]
    q.zero_()
    k.zero_()
    q[0, :, 0], q[0, :, 1] = 2048, 1
    page = int(pb["page_table"][0, 0])
    k[page, 0, 0, :2] = torch.tensor([4096.0, 1.0], device=device)  # 16 (2^23 + 1) = 2^27 + 16: odd mantissa
    k[page, 64, 0, :2] = torch.tensor([4096.0, 2.0], device=device)  # 2^27 + 32 (qk_scale 16 below)
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=1, sm_scale=16 / 1.4426950408889634)
    assert torch.isfinite(o).all()
    _check(o, l_, ro, rl, torch.float16)


def _run_padded(device, pb, splits, total_rows=None, **kw):
    """The transposed decode on ``pb`` plus rows past ``qo_indptr[B]`` up to ``total_rows``
    (padding rows of a static plan: no request, no key): (out, lse) of all rows."""
    q = pb["q"]
    n, hq, d = q.shape
    rows = total_rows or n
    pb = dict(pb)
    if rows > n:
        pad = torch.randn(rows - n, hq, d).to(q.dtype).to(device)
        pb["q"] = torch.cat([q, pad])
        idx = pb["kv_block_indexes"]
        pb["kv_block_indexes"] = torch.cat([idx, torch.zeros_like(idx[:1]).expand(rows - n, -1, -1)]).contiguous()
    out = poisoned((rows, hq, d), torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype, device)
    lse = poisoned((rows, hq), torch.float32, device)
    sparse_attention(**pb, out=out, lse=lse, decode=True, num_kv_splits=splits, **kw)
    return out, lse


# q_lens, kv_lens, flat page list, qo_offset, padding rows, index rows per query head, causal, splits
LIST_CASES = [
    ([1, 1, 1], [300, 50, 129], False, None, 0, False, True, 1),  # decode: request = token
    ([2, 0, 1, 3], [300, 50, 129, 700], True, [100, 0, 128, 690], 0, False, True, 2),  # binary search
    ([1, 0, 2], [384, 10, 129], False, None, 3, True, True, 3),
    ([1, 2], [257, 640], True, None, 2, False, False, 2),  # not causal
]


@pytest.mark.parametrize("q_lens,kv_lens,flat,qo_offset,pad,wide,causal,splits", LIST_CASES)
def test_transposed_decode_block_lists(device, triton_backend, transposed, q_lens, kv_lens, flat, qo_offset, pad,
                                       wide, causal, splits):
    """The decode program's own block list (:func:`sparse_decode.token_block_list`): the
    token's request found directly or by binary search, padding rows empty."""
    dtype = torch.float8_e4m3fn if splits == 3 else torch.bfloat16
    pb = make_problem(q_lens, kv_lens, hq=16, hkv=1, width=8, dtype=dtype, device=device, flat=flat,
                      qo_offset=qo_offset, hq_wide=wide)
    n = sum(q_lens)
    o, l_ = _run_padded(device, pb, splits, total_rows=n + pad, causal=causal)
    cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in pb.items()}
    ro, rl = sparse_attention_reference(**cpu, causal=causal)
    _check(o[:n], l_[:n], ro, rl, dtype)
    assert (o[n:].float() == 0).all() and torch.isinf(l_[n:]).all() and (l_[n:] < 0).all()


def test_decode_variant_env_overrides():
    assert sd._env_overrides("fp8_stages=2, fp8_maxnreg=128,fp8_keys=64") == {
        "fp8_stages": 2, "fp8_maxnreg": 128, "fp8_keys": 64}
    assert sd._env_overrides("fp8_maxnreg=none,kernel=heads") == {"fp8_maxnreg": None, "kernel": "heads"}
    with pytest.raises(ValueError, match="unknown key"):
        sd._env_overrides("fp8_direct=1")


def test_transposed_programs_per_sm_and_workspace_bound(monkeypatch):
    """Residency from the compile table, and the auto-split workspace bound of the heads-on-M
    kernel also covers the transposed kernel's splits."""
    from mate.ops.msa import sparse_attention as sa

    cpu = torch.device("cpu")
    monkeypatch.setitem(sd.DECODE_VARIANT, "kernel", "transposed")
    assert sd.t_programs_per_sm(False) == 2  # 64-key tiles, 3 stages: 104 KB
    monkeypatch.setitem(sd.DECODE_VARIANT, "stages", 2)
    assert sd.t_programs_per_sm(False) == 3  # 64-key tiles, 2 stages: 72 KB
    assert sd.t_programs_per_sm(True) == 4  # fp8 64-key tiles, 3 stages: 127 registers, 52 KB
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_maxnreg", 96)
    assert sd.t_programs_per_sm(True) == 4  # shared memory still allows only 4
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_v", "gather")  # the byte-gather path: 44 KB
    assert sd.t_programs_per_sm(True) == 5  # capped at 96 registers
    monkeypatch.setitem(sd.DECODE_VARIANT, "keys", 128)
    assert sd.t_programs_per_sm(False) == 1  # 139 KB
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_maxnreg", None)
    assert sd.t_programs_per_sm(True) == 3  # uncapped: 153 registers
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_maxnreg", 160)
    assert sd.t_programs_per_sm(True) == 3
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_v", "mma")
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_keys", 128)
    assert sd.t_programs_per_sm(True) == 2  # 128-key tiles: 202 registers, 102 KB
    for rows in (1, 33, 128):
        _, n_flt = sa.workspace_numel(rows, 64, 4, 17, True, -1, cpu)
        for r in range(1, rows + 1):
            for fp8 in (False, True):
                s = sa.resolve_num_splits(-1, r, 64, 4, 17, True, cpu, fp8)
                assert sa.workspace_numel(r, 64, 4, 17, True, s, cpu)[1] <= n_flt


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits", [-1, 1, 3])
def test_transposed_decode_gpu_m3(transposed, dtype, layout, splits):
    """M3 geometry (64 q heads, 4 KV heads, width 16 + 1 forced) at random lengths, every
    pipelining configuration of the compile table."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b = 7
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(b)]
    pb = make_problem([1] * b, kv_lens, hq=64, hkv=4, width=17, dtype=dtype, device="cuda", layout=layout)
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    is_fp8 = dtype == torch.float8_e4m3fn
    pre = "fp8_" if is_fp8 else ""
    for (fp8, keys, stages, v_mma) in sd.T_COMPILES:
        if fp8 != is_fp8:
            continue
        old = dict(sd.DECODE_VARIANT)
        sd.DECODE_VARIANT.update({pre + "keys": keys, pre + "stages": stages})
        if fp8:
            sd.DECODE_VARIANT["fp8_v"] = "mma" if v_mma else "gather"
        try:
            o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, sm_scale=scale[0], k_scale=scale[1],
                                     v_scale=scale[2], strided=True)
        finally:
            sd.DECODE_VARIANT.update(old)
        _check(o, l_, ro, rl, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,layout,splits,variant", [
    (torch.bfloat16, "NHD", -1, {}), (torch.float8_e4m3fn, "NHD", -1, {}), (torch.float8_e4m3fn, "HND", 3, {}),
    (torch.bfloat16, "HND", 2, {"stages": 2}), (torch.float8_e4m3fn, "NHD", 1, {"fp8_stages": 2, "fp8_maxnreg": None}),
    (torch.float8_e4m3fn, "NHD", -1, {"fp8_lazy": 0}), (torch.float8_e4m3fn, "HND", 2, {"fp8_lazy": 1}),
    (torch.bfloat16, "NHD", 1, {"lazy": 0})])
def test_transposed_decode_gpu_m3_block_lists(transposed, monkeypatch, dtype, layout, splits, variant):
    """M3 geometry, width 16: one query per request (the common case) then requests of several
    queries and padding rows (the binary search), against the reference."""
    for key, val in variant.items():
        monkeypatch.setitem(sd.DECODE_VARIANT, key, val)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(7)]
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    for q_lens, pad in (([1] * 7, 0), ([1, 3, 0, 2, 1, 1, 4], 5)):
        pb = make_problem(q_lens, kv_lens, hq=64, hkv=4, width=16, dtype=dtype, device="cuda", layout=layout)
        n = sum(q_lens)
        o, l_ = _run_padded("cuda", pb, splits, total_rows=n + pad, sm_scale=scale[0], k_scale=scale[1],
                            v_scale=scale[2])
        cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in pb.items()}
        ro, rl = sparse_attention_reference(**cpu, sm_scale=scale[0], k_scale=scale[1], v_scale=scale[2])
        _check(o[:n], l_[:n], ro, rl, dtype)
        assert (o[n:].float() == 0).all() and torch.isinf(l_[n:]).all() and (l_[n:] < 0).all()


def test_fp8_v_mma_up_to_16_head_columns():
    assert sd.t_constexprs(True)["V_MMA"] and sd.t_constexprs(True, 16)["V_MMA"]
    assert not sd.t_constexprs(True, 32)["V_MMA"]
    assert not sd.t_constexprs(False)["V_MMA"]


def test_probe_stand_ins_take_the_decode_kernels_arguments(monkeypatch):
    """The probes that launch their own kernel where ``sparse_attention`` launches
    ``msa_decode_t_kernel`` take its runtime arguments in its order (a new kernel argument
    must reach them too)."""
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import probe_msa_decode_floor
    import probe_msa_decode_fp8_pv
    import probe_msa_decode_warp

    real = sd.msa_decode_t_kernel.arg_names
    runtime = real[: real.index("W") + 1]
    assert probe_msa_decode_floor.floor_kernel.arg_names[: len(real)] == real
    assert probe_msa_decode_fp8_pv.msa_decode_fp8_pv_kernel.arg_names[: len(runtime)] == runtime
    assert probe_msa_decode_warp.msa_decode_warp_kernel.arg_names[: len(real)] == real


@interpreter_only
def test_per_warp_decode_probe_matches_the_reference(monkeypatch, random_seed):
    """The per-warp decode probe (not a library kernel, not yet timed) computes the decode: bf16
    and fp8 against the reference, under the interpreter (bf16 output: a few bf16 ulps)."""
    import pathlib

    monkeypatch.setenv("MATE_BACKEND", "triton")
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import probe_msa_decode_warp

    for name, (err_o, err_l) in probe_msa_decode_warp.check(random_seed).items():
        assert err_o < 2e-2 and err_l < 1e-4, (name, err_o, err_l)


def test_hopper_has_no_fp8_mma_sync(monkeypatch):
    """Why the per-warp decode stays untimed: ptxas lowers an e4m3 ``mma.sync`` for sm_90a to
    unpacks and fp16 HMMA (the widening Triton's build already does), native only on sm_89."""
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import probe_msa_decode_warp

    ops = probe_msa_decode_warp.fp8_mma_sync_sass()
    assert ops["sm_89"] == {"QMMA.16832.F32.E4M3.E4M3": 1}
    assert ops["sm_90a"].get("HMMA.16816.F32") == 2 and ops["sm_90a"].get("F2FP.F16.E4M3.UNPACK_B", 0) >= 8
    assert not any(op.startswith("QMMA") for op in ops["sm_90a"])
