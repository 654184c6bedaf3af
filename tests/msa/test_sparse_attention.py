"""MSA sparse forward: the reference against a float64 loop, the Triton kernels against
the reference (CPU interpreter and GPU), and validation errors."""

from __future__ import annotations

import math

import pytest
import torch

from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.ops.msa.sparse_attention import sparse_attention
from mate.testing import assert_close, poisoned
from mate.testing.numeric import fp8_mma_on_gpu

BLK = 128


def make_problem(q_lens, kv_lens, hq, hkv, width, *, dtype=torch.bfloat16, device="cpu", layout="NHD",
                 flat=False, hq_wide=False, qo_offset=None, adversarial=True, seed=None):
    """Random sparse-attention inputs with a shuffled page table and messy block lists."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % (2**31))
    d = 128
    b = len(q_lens)
    total_q = sum(q_lens)
    nblks = [-(-kl // BLK) for kl in kv_lens]
    num_pages = sum(nblks) + 3
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    pages, p = [], 0
    for n in nblks:
        pages.append(perm[p:p + n])
        p += n
    max_pages = max(max(nblks), 1) + 1
    page_table = torch.zeros(b, max_pages, dtype=torch.int32)
    for i, pg in enumerate(pages):
        page_table[i, :len(pg)] = pg
    kv_indices = torch.cat(pages) if pages else torch.zeros(0, dtype=torch.int32)
    kv_page_indptr = torch.tensor([0] + list(torch.tensor(nblks).cumsum(0).tolist()), dtype=torch.int32)
    shape = (num_pages, BLK, hkv, d) if layout == "NHD" else (num_pages, hkv, BLK, d)

    def rnd(shape_):
        x = torch.randn(shape_, generator=g)
        return x.clamp(-448, 448).to(dtype)

    q, k, v = rnd((total_q, hq, d)), rnd(shape), rnd(shape)
    hidx = hq if hq_wide else hkv
    idx = torch.full((total_q, hidx, width), -1, dtype=torch.int32)
    t = 0
    for i in range(b):
        for _ in range(q_lens[i]):
            n = nblks[i]
            ids = torch.randint(-1, max(n, 1) + (2 if adversarial else 0), (hidx, width), generator=g)
            if adversarial and width >= 2:
                ids[:, 1] = ids[:, 0]  # duplicates
            idx[t] = ids.to(torch.int32)
            t += 1
    qo_indptr = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    kvl = torch.tensor(kv_lens, dtype=torch.int32)
    off = None if qo_offset is None else torch.tensor(qo_offset, dtype=torch.int32)
    mv = lambda x: None if x is None else x.to(device)  # noqa: E731
    tensors = dict(q=q, k=k, v=v, kv_block_indexes=idx, qo_indptr=qo_indptr, kv_lens=kvl, qo_offset=off)
    tensors = {key: mv(val) for key, val in tensors.items()}
    if flat:
        tensors.update(kv_indices=kv_indices.to(device), kv_page_indptr=kv_page_indptr.to(device))
    else:
        tensors.update(page_table=page_table.to(device))
    return tensors


def loop_reference(q, k, v, kv_block_indexes, qo_indptr, kv_lens, qo_offset=None, page_table=None,
                   kv_indices=None, kv_page_indptr=None, sm_scale=None, k_scale=1.0, v_scale=1.0,
                   causal=True, layout="NHD"):
    """Plain float64 loops over tokens, heads and keys: the spec read literally."""
    total_q, hq, d = q.shape
    hkv = k.shape[2] if layout == "NHD" else k.shape[1]
    ratio = hq // hkv
    sm_scale = d ** -0.5 if sm_scale is None else sm_scale
    out = torch.zeros(total_q, hq, d, dtype=torch.float64)
    lse = torch.full((total_q, hq), -math.inf, dtype=torch.float64)
    ip = qo_indptr.tolist()
    for i in range(len(kv_lens)):
        kl = int(kv_lens[i])
        nblk = -(-kl // BLK)
        for j in range(ip[i + 1] - ip[i]):
            t = ip[i] + j
            pos = (kl - (ip[i + 1] - ip[i]) if qo_offset is None else int(qo_offset[i])) + j
            for h in range(hq):
                g = h // ratio
                row = kv_block_indexes[t, g if kv_block_indexes.shape[1] == hkv else g * ratio].tolist()
                blocks = sorted({b for b in row if 0 <= b < nblk})
                logits, vals = [], []
                for b in blocks:
                    page = int(page_table[i, b]) if page_table is not None else int(
                        kv_indices[int(kv_page_indptr[i]) + b])
                    for o in range(BLK):
                        key = b * BLK + o
                        if key >= kl or (causal and key > pos):
                            continue
                        kk = k[page, o, g] if layout == "NHD" else k[page, g, o]
                        vv = v[page, o, g] if layout == "NHD" else v[page, g, o]
                        logits.append(float((q[t, h].double() * kk.double()).sum()) * sm_scale * k_scale)
                        vals.append(vv.double() * v_scale)
                if logits:
                    s = torch.tensor(logits, dtype=torch.float64)
                    m = s.max()
                    p = torch.exp(s - m)
                    out[t, h] = (p[:, None] * torch.stack(vals)).sum(0) / p.sum()
                    lse[t, h] = m + torch.log(p.sum())
    return out, lse


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("flat", [False, True])
def test_reference_matches_float64_loop(layout, flat):
    pb = make_problem([3, 2], [200, 300], hq=4, hkv=2, width=4, dtype=torch.float64, layout=layout, flat=flat,
                      qo_offset=[100, 298])
    out, lse = sparse_attention_reference(**pb, sm_scale=0.07, k_scale=1.5, v_scale=0.5,
                                          compute_dtype=torch.float64)
    ro, rl = loop_reference(**pb, sm_scale=0.07, k_scale=1.5, v_scale=0.5, layout=layout)
    # both sides in float64: only summation-order differences
    assert_close(out, ro, atol=1e-10, rtol=1e-10)
    assert_close(lse, rl, atol=1e-10, rtol=1e-10)
    assert torch.isfinite(rl).any()


def test_reference_empty_rows_give_zero_and_minus_inf():
    pb = make_problem([2], [256], hq=2, hkv=1, width=4, dtype=torch.float32)
    pb["kv_block_indexes"].fill_(-1)
    pb["kv_block_indexes"][0, 0, 0] = 1  # token 0 (position 254) sees part of block 1
    pb["kv_block_indexes"][1, 0, 0] = 7  # out of range: skipped
    out, lse = sparse_attention_reference(**pb)
    assert torch.isfinite(lse[0]).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isinf(lse[1]).all() and (lse[1] < 0).all()


def run_case(device, pb, *, decode=False, causal=True, sm_scale=None, k_scale=1.0, v_scale=1.0, splits=None,
             strided=False):
    q = pb["q"]
    total_q, hq, d = q.shape
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    if strided:
        big = poisoned((total_q, hq + 3, d), out_dtype, device)
        out = big[:, 1:hq + 1]
        bigl = poisoned((total_q, hq + 2), torch.float32, device)
        lse = bigl[:, :hq]
    else:
        out = poisoned((total_q, hq, d), out_dtype, device)
        lse = poisoned((total_q, hq), torch.float32, device)
    o, l_ = sparse_attention(**pb, out=out, lse=lse, decode=decode, causal=causal, sm_scale=sm_scale,
                             k_scale=k_scale, v_scale=v_scale, num_kv_splits=splits)
    assert o is out and l_ is lse
    cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in pb.items()}
    ro, rl = sparse_attention_reference(**cpu, causal=causal, sm_scale=sm_scale, k_scale=k_scale,
                                        v_scale=v_scale)
    return o, l_, ro, rl


# Tolerances: outputs are compared at the output dtype's resolution (bf16: 2^-8 relative,
# fp16: 2^-11); the kernel rounds P to the value dtype before the PV product (one more
# rounding of the same size), so atol/rtol are ~2-4 output ulps. LSE is fp32 math on the
# same logits: 1e-4 relative covers accumulation order over <= 8K terms.
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (3e-3, 3e-3), torch.float8_e4m3fn: (3e-2, 3e-2)}


def assert_lse_close(lse, ref, dtype, device) -> None:
    """LSE against the reference. fp8 Q·K on a GPU runs on FP8 tensor cores, whose accumulator
    keeps ~13 mantissa bits (truncating) at each of the 4 k-steps of a 128-wide product, so a
    logit is off by up to ~4 * 2^-13 = 4.9e-4 of the magnitude of its partial sums, not of the
    LSE (which can be near 0). The bound is 1e-3 of the logits' magnitude (the largest finite
    |reference LSE|, at least 2.5): 2.5e-3 for the usual |logits| of ~5 (measured on the H200:
    up to 8.6e-4, at LSE 1.98 and at -0.10), 0.038 at the lazy-rescale test's LSE of ~38
    (measured: 0.018). Elsewhere the logits are fp32 math: 1e-4."""
    if fp8_mma_on_gpu(dtype, device):
        finite = ref[torch.isfinite(ref)].abs()
        atol, rtol = 1e-3 * max(2.5, float(finite.max()) if finite.numel() else 0.0), 0.0
    else:
        atol, rtol = 1e-4, 1e-4
    assert_close(lse, ref, atol=atol, rtol=rtol, name="lse")


CASES = [
    (torch.bfloat16, 16, 16, "NHD", False, False, False),  # M3-like prefill tile 4 x 16
    (torch.bfloat16, 16, 16, "HND", True, True, True),  # decode, head-major, flat pages
    (torch.float16, 1, 4, "NHD", False, False, False),  # MHA ratio 1
    (torch.float16, 3, 8, "HND", False, False, True),  # odd ratio, padded group
    (torch.bfloat16, 8, 64, "NHD", True, False, False),  # widest rows
    (torch.float8_e4m3fn, 4, 8, "NHD", False, True, False),  # fp8 decode
    (torch.float8_e4m3fn, 16, 16, "HND", False, False, False),  # fp8 prefill
    (torch.bfloat16, 32, 17, "NHD", False, False, False),  # ratio > 16, width 16 + 1 forced (not a power of 2)
]


@pytest.mark.parametrize("dtype,ratio,width,layout,flat,decode,hq_wide", CASES)
def test_sparse_attention_matches_reference(device, triton_backend, dtype, ratio, width, layout, flat, decode,
                                            hq_wide):
    hkv = 2 if ratio <= 8 else 1
    q_lens = [3, 0, 2] if decode else [5, 0, 3]
    kv_lens = [300, 50, 129] if decode else [261, 64, 3]
    pb = make_problem(q_lens, kv_lens, hq=hkv * ratio, hkv=hkv, width=width, dtype=dtype, device=device,
                      layout=layout, flat=flat, hq_wide=hq_wide)
    scale = (0.5, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    o, l_, ro, rl = run_case(device, pb, decode=decode, sm_scale=None if scale[0] is None else 0.05,
                             k_scale=scale[1], v_scale=scale[2])
    atol, rtol = TOL[dtype]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_lse_close(l_, rl, dtype, device)


@pytest.mark.parametrize("decode", [True, False])
def test_fp8_bf16_conversion_variant(device, triton_backend, monkeypatch, decode):
    """The previous fp8 path (V and P converted to bf16, one stage) stays correct; the
    default (fp16 conversions, 2-stage decode) is covered by CASES."""
    from mate.ops.msa import sparse_attention as sa

    monkeypatch.setitem(sa.FP8_VARIANT, "f16", False)
    monkeypatch.setitem(sa.FP8_VARIANT, "decode_stages", 1)
    q_lens = [2, 1] if decode else [5, 2]
    pb = make_problem(q_lens, [300, 129], hq=8, hkv=1, width=8, dtype=torch.float8_e4m3fn, device=device)
    o, l_, ro, rl = run_case(device, pb, decode=decode, sm_scale=0.05, k_scale=2.0, v_scale=0.25)
    atol, rtol = TOL[torch.float8_e4m3fn]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_lse_close(l_, rl, torch.float8_e4m3fn, device)


@pytest.mark.parametrize("keys,stages", [(128, 1), (64, 2), (64, 1)])
def test_fp8_prefill_tile_variants(device, triton_backend, monkeypatch, keys, stages):
    """fp8 prefill (64-row tiles) with the selectable key tile and TMA stages (FP8_VARIANT
    ``prefill_keys`` / ``prefill_stages``; the default, 128 keys and 2 stages, is covered by
    CASES); on the GPU the 128-key tiles give the default's bits at any stage count."""
    from mate.ops.msa import sparse_attention as sa

    pb = make_problem([9, 3, 14], [300, 129, 400], hq=16, hkv=2, width=8, dtype=torch.float8_e4m3fn,
                      device=device)
    default = run_case(device, pb, sm_scale=0.05, k_scale=2.0, v_scale=0.25)
    monkeypatch.setitem(sa.FP8_VARIANT, "prefill_keys", keys)
    monkeypatch.setitem(sa.FP8_VARIANT, "prefill_stages", stages)
    o, l_, ro, rl = run_case(device, pb, sm_scale=0.05, k_scale=2.0, v_scale=0.25)
    atol, rtol = TOL[torch.float8_e4m3fn]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_lse_close(l_, rl, torch.float8_e4m3fn, device)
    if torch.device(device).type == "cuda" and keys == 128:
        assert torch.equal(o, default[0]) and torch.equal(l_, default[1])


@pytest.mark.parametrize("splits", [1, 2])
def test_fp8_decode_64_key_halves(device, triton_backend, monkeypatch, splits):
    """fp8 decode reading each selected block as two 64-key TMA tiles (FP8_VARIANT decode_keys)."""
    from mate.ops.msa import sparse_attention as sa

    monkeypatch.setitem(sa.FP8_VARIANT, "decode_keys", 64)
    monkeypatch.setitem(sa.FP8_VARIANT, "decode_maxnreg", 96)
    pb = make_problem([1, 2], [300, 129], hq=8, hkv=1, width=8, dtype=torch.float8_e4m3fn, device=device,
                      layout="HND")
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, sm_scale=0.05, k_scale=2.0, v_scale=0.25)
    atol, rtol = TOL[torch.float8_e4m3fn]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_lse_close(l_, rl, torch.float8_e4m3fn, device)


def test_auto_split_rule_and_workspace_bound():
    """The automatic decode split: unsplit for a full wave, split for small batches, and the
    workspace sized for the auto split covers every smaller call."""
    from mate.ops.msa import sparse_attention as sa

    cpu = torch.device("cpu")
    assert sa.choose_num_splits(128, 4, 17, cpu, 4) == 1
    assert sa.choose_num_splits(32, 4, 17, cpu, 4) > 1
    assert sa.choose_num_splits(8, 4, 17, cpu, 4) > 1
    # the one-wave rule at the H200's measured points (132 SMs off the GPU; bf16 2 programs per
    # SM, fp8 4): B=48 bf16 unsplit (2 splits would need a second wave), fp8 2 splits; B=16 bf16 4
    assert sa.choose_num_splits(48, 4, 16, cpu, 2) == 1
    assert sa.choose_num_splits(48, 4, 16, cpu, 4) == 2
    assert sa.choose_num_splits(16, 4, 16, cpu, 2) == 4
    assert sa.choose_num_splits(1, 4, 16, cpu, 4) == 8
    assert sa.choose_num_splits(1, 4, 3, cpu, 4) == 3  # never more splits than blocks
    for rows in (1, 7, 33, 128, 700):
        _, n_flt = sa.workspace_numel(rows, 64, 4, 17, True, -1, cpu)
        for r in range(1, rows + 1):
            for fp8 in (False, True):
                s = sa.resolve_num_splits(-1, r, 64, 4, 17, True, cpu, fp8)
                _, need = sa.workspace_numel(r, 64, 4, 17, True, s, cpu)
                assert need <= n_flt, (rows, r, s)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_splits_qo_offset_non_causal_strided(device, triton_backend, splits):
    pb = make_problem([1, 1, 2], [700, 1, 520], hq=8, hkv=2, width=8, device=device, qo_offset=[100, 0, 515])
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, strided=True)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(l_, rl, atol=1e-4, rtol=1e-4, name="lse")
    pb2 = make_problem([2, 3], [300, 200], hq=4, hkv=1, width=4, device=device)
    o, l_, ro, rl = run_case(device, pb2, decode=False, causal=False)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(l_, rl, atol=1e-4, rtol=1e-4, name="lse")


@pytest.mark.parametrize("decode,splits", [(True, 1), (True, 3), (False, 1)])
def test_lse_buffer_of_any_strides(device, triton_backend, decode, splits):
    """The LSE lands at lse[t, h] whatever the buffer's strides: FlashAttention's [Hq, total_q]
    transposed, and every other column of a wider buffer (the columns between stay NaN). Each
    store path is covered: unsplit decode, the split decode's combine, the prefill kernel."""
    q_lens = [1, 1, 1] if decode else [5, 3]
    pb = make_problem(q_lens, [700, 130, 300][:len(q_lens)], hq=8, hkv=2, width=8, device=device)
    total_q = sum(q_lens)
    ro = rl = None
    for kind in ("transposed", "every other column"):
        if kind == "transposed":
            lse = poisoned((8, total_q), torch.float32, device).t()
        else:
            wide = poisoned((total_q, 16), torch.float32, device)
            lse = wide[:, ::2]
        out = poisoned((total_q, 8, 128), torch.bfloat16, device)
        sparse_attention(**pb, out=out, lse=lse, decode=decode, num_kv_splits=splits)
        if ro is None:
            cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in pb.items()}
            ro, rl = sparse_attention_reference(**cpu)
        assert_close(out, ro, atol=2e-2, rtol=2e-2)
        assert_close(lse, rl, atol=1e-4, rtol=1e-4, name=f"lse ({kind})")
        if kind != "transposed":
            assert torch.isnan(wide[:, 1::2]).all(), "a column between the LSE's columns was written"


def test_no_visible_key_gives_zero_and_minus_inf(device, triton_backend):
    pb = make_problem([4], [384], hq=16, hkv=1, width=4, device=device)
    idx = pb["kv_block_indexes"]
    idx.fill_(-1)
    idx[1, 0, 2] = 9  # out of range
    idx[2, 0, 3] = 2  # a valid block
    o, l_, ro, rl = run_case(device, pb)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(l_, rl, atol=1e-4, rtol=1e-4, name="lse")
    assert (o[[0, 1, 3]].float() == 0).all() and torch.isinf(l_[[0, 1, 3]]).all()


def test_empty_batch_and_zero_tokens(device, triton_backend):
    pb = make_problem([0, 0], [128, 5], hq=4, hkv=1, width=4, device=device)
    o, l_ = sparse_attention(**pb)
    assert o.shape == (0, 4, 128) and l_.shape == (0, 4)


def test_validation_errors(device):
    pb = make_problem([2], [200], hq=4, hkv=2, width=4, device=device)
    with pytest.raises(TypeError, match="kv_block_indexes"):
        sparse_attention(**{**pb, "kv_block_indexes": pb["kv_block_indexes"].long()})
    with pytest.raises(TypeError, match="k must be"):
        sparse_attention(**{**pb, "k": pb["k"].half()})
    with pytest.raises(ValueError, match="head_dim"):
        sparse_attention(**{**pb, "q": pb["q"][:, :, :64]})
    with pytest.raises(ValueError, match="num_qo_heads"):
        sparse_attention(**{**pb, "q": pb["q"][:, :3]})
    with pytest.raises(ValueError, match="width"):
        sparse_attention(**{**pb, "kv_block_indexes": torch.zeros(2, 2, 65, dtype=torch.int32, device=device)})
    with pytest.raises(ValueError, match="qo_indptr"):
        sparse_attention(**{**pb, "qo_indptr": pb["qo_indptr"][:1]})
    with pytest.raises(ValueError, match="out"):
        sparse_attention(**pb, out=torch.empty(2, 4, 64, dtype=torch.bfloat16, device=device))
    with pytest.raises(TypeError, match="lse"):
        sparse_attention(**pb, lse=torch.empty(2, 4, dtype=torch.float16, device=device))
    no_pages = {key: val for key, val in pb.items() if key != "page_table"}
    with pytest.raises(ValueError, match="page_table"):
        sparse_attention(**no_pages)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,ratio,width,layout,flat,decode,hq_wide", CASES)
def test_sparse_attention_gpu_random_lengths(dtype, ratio, width, layout, flat, decode, hq_wide):
    """The CPU cases on the H200 (tensor cores, TMA, races), at larger random lengths."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    hkv = 2 if ratio <= 8 else 4
    b = 6
    q_lens = torch.randint(0, 3 if decode else 300, (b,), generator=g).tolist()
    kv_lens = [ql + int(torch.randint(0, 3000, (1,), generator=g)) for ql in q_lens]
    pb = make_problem(q_lens, kv_lens, hq=hkv * ratio, hkv=hkv, width=width, dtype=dtype, device="cuda",
                      layout=layout, flat=flat, hq_wide=hq_wide)
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    o, l_, ro, rl = run_case("cuda", pb, decode=decode, sm_scale=scale[0], k_scale=scale[1], v_scale=scale[2],
                             splits=3 if decode and width >= 8 else None, strided=True)
    atol, rtol = TOL[dtype]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_lse_close(l_, rl, dtype, "cuda")


def test_custom_op_opcheck(device, triton_backend):
    from mate.ops.msa.sparse_attention import msa_sparse_attention_op

    pb = make_problem([2], [130], hq=16, hkv=1, width=4, device=device)
    out = torch.empty(2, 16, 128, dtype=torch.bfloat16, device=device)
    lse = torch.empty(2, 16, device=device)
    iws = torch.empty(4096, dtype=torch.int32, device=device)
    fws = torch.empty(2 * 2 * 16 * 129, device=device)
    args = (pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["qo_indptr"], pb["kv_lens"], None,
            pb["page_table"], None, None, out, lse, iws, fws, False, 0.088, 1.0, 1.0, True, True, 2)
    torch.library.opcheck(msa_sparse_attention_op.op, args, test_utils=("test_schema", "test_faketensor"))


def test_bad_pages_are_skipped_not_read(device, triton_backend):
    """A page id outside the cache (or a table narrower than the context) drops that block:
    the result equals the reference with the block removed from every list of its request."""
    pb = make_problem([3, 2], [400, 300], hq=16, hkv=1, width=4, device=device)
    pt = pb["page_table"].clone()
    pt[0, 1] = 10**6
    pt[1, 2] = -7
    o, l_ = sparse_attention(**{**pb, "page_table": pt})
    idx = pb["kv_block_indexes"].cpu().clone()
    idx[:3][idx[:3] == 1] = -1
    idx[3:][idx[3:] == 2] = -1
    cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in pb.items()}
    ro, rl = sparse_attention_reference(**{**cpu, "kv_block_indexes": idx})
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(l_, rl, atol=1e-4, rtol=1e-4, name="lse")
    narrow = pb["page_table"][:, :2]  # blocks >= 2 have no page: skipped
    o, l_ = sparse_attention(**{**pb, "page_table": narrow})
    idx = pb["kv_block_indexes"].cpu().clone()
    idx[idx >= 2] = -1
    ro, rl = sparse_attention_reference(**{**cpu, "kv_block_indexes": idx})
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(l_, rl, atol=1e-4, rtol=1e-4, name="lse")


@pytest.mark.parametrize("flat", [False, True])
def test_reference_skips_missing_pages(flat):
    """The reference skips a selected block whose page is -1 or outside the cache (a negative id
    must not wrap to the cache's last page), as the kernels do: it equals the reference over the
    same inputs with those blocks dropped from the block lists."""
    pb = make_problem([2, 1], [300, 129], 4, 2, 6, flat=flat, adversarial=False)
    key = "kv_indices" if flat else "page_table"
    bad = pb[key].clone()
    n_pages = pb["k"].shape[0]
    # request 0: block 0 -> page -1, block 1 -> a page past the cache; request 1: block 1 -> -2
    if flat:
        bad[0], bad[1], bad[4] = -1, n_pages + 5, -2
    else:
        bad[0, 0], bad[0, 1], bad[1, 1] = -1, n_pages + 5, -2
    args = {k_: v_ for k_, v_ in pb.items() if k_ != key}
    got = sparse_attention_reference(**args, **{key: bad}, num_kv_heads=2)
    idx = pb["kv_block_indexes"].clone()
    idx[:2][(idx[:2] == 0) | (idx[:2] == 1)] = -1
    idx[2:][idx[2:] == 1] = -1
    want = sparse_attention_reference(**{**args, "kv_block_indexes": idx}, **{key: pb[key]}, num_kv_heads=2)
    assert_close(got[0], want[0], atol=0, rtol=0)
    assert_close(got[1], want[1], atol=0, rtol=0, name="lse")
