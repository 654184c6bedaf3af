"""Max-score pass: reference vs a float64 loop, the Triton kernel vs the reference (CPU
interpreter), and GPU cases up to 128K context."""

from __future__ import annotations

import math

import pytest
import torch

from mate.msa_interface import MsaRuntimeMetadata, _msa_plan_from_lengths, msa, msa_plan
from mate.testing import assert_close, poisoned
from mate.testing.numeric import fp8_mma_on_gpu

BLK = 128
# fp32 accumulation of D <= 128 products of exactly representable inputs: the kernel and
# the reference differ only in summation order (a few fp32 ulps of sum |q_i k_i|).
ATOL, RTOL = 1e-4, 1e-5


def _tol(dtype, device) -> dict:
    """fp32 logits (bf16/fp16 products, or the interpreter's exact fp8 ones): ATOL/RTOL."""
    return dict(atol=ATOL, rtol=RTOL)


def assert_scores_close(ms, ref, ref_abs, dtype, device) -> None:
    """``ms`` against the reference maxima ``ref``. fp8 Q·K on a GPU runs on FP8 tensor cores,
    whose accumulator keeps ~13 mantissa bits (truncating) at each 32-wide k-step: a score is off
    by up to ~(k-steps) * 2^-13 of its partial sums' magnitude, which ``ref_abs`` (the maxima of
    |q|·|k| over the same keys) bounds; relative to the score itself the error is unbounded
    where products cancel (seen on the H200: 3.625 against 3.618 in a tile of |q|·|k| ~ 300)."""
    if not fp8_mma_on_gpu(dtype, device):
        assert_close(ms, ref, **_tol(dtype, device))  # also checks the -inf pattern exactly
        return
    assert torch.equal(torch.isinf(ms), torch.isinf(ref)) and torch.equal(ms[ms.isinf()], ref[ref.isinf()])
    fin = ref.isfinite()
    bound = ATOL + 4 * 2.0**-13 * ref_abs[fin]  # at most 4 k-steps (d <= 128)
    diff = (ms[fin] - ref[fin]).abs()
    assert bool((diff <= bound).all()), f"max excess {float((diff - bound).max()):.3g}"
DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def _randn(shape, dtype, device):
    x = torch.randn(shape, device=device)
    return (x * 4).clamp(-448, 448).to(dtype) if dtype == torch.float8_e4m3fn else x.to(dtype)


def make_case(q_lens, kv_lens, hq, hkv, d, dtype, device, *, layout="dense", qo_offset=None, causal=True,
              extra_pages=3):
    """Random q and K (dense ragged or a shuffled paged cache) plus the eager plan."""
    qo, kv = torch.tensor(q_lens), torch.tensor(kv_lens)
    page = BLK if layout != "dense" else -1
    info = _msa_plan_from_lengths(qo, kv, hq, hkv, qo_offset=qo_offset, causal=causal, page_size=page,
                                  output_maxscore=True, split_prefill_decode=False, device=device)
    q = _randn((int(qo.sum()), hq, d), dtype, device)
    kw = {}
    if layout == "dense":
        k = _randn((int(kv.sum()), hkv, d), dtype, device)
    else:
        nblk = [-(-n // BLK) for n in kv_lens]
        pages = sum(nblk) + extra_pages
        perm = torch.randperm(pages)
        table = torch.zeros(len(kv_lens), max(nblk + [1]), dtype=torch.int32)
        flat, p = [], 0
        for i, n in enumerate(nblk):
            table[i, :n] = perm[p:p + n].int()
            flat += perm[p:p + n].tolist()
            p += n
        k = _randn((pages, BLK, hkv, d), dtype, device)
        if layout == "head_major":
            k = k.transpose(1, 2).contiguous()
        if layout == "flat":
            kw["kv_indices"] = torch.tensor(flat, dtype=torch.int32, device=device)
        else:
            kw["page_table"] = table.to(device)
    return info, q, k, kw


def loop_max_score(q, k, q_lens, kv_lens, layout, kw, causal=True, qo_offset=None, tiles=None):
    """Plain float64 loop over tokens, heads and keys."""
    total_q, hq, _ = q.shape
    hkv = k.shape[1] if layout in ("dense", "head_major") else k.shape[2]
    tiles = tiles or max([-(-n // BLK) for n in kv_lens] + [0])
    out = torch.full((total_q, hq, tiles), -math.inf, dtype=torch.float64)
    qd, kd = q.double().cpu(), k.double().cpu()
    table = kw.get("page_table")
    flat = kw.get("kv_indices")
    t, k0, p0 = 0, 0, 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        off = kl - ql if qo_offset is None else int(qo_offset[b] if not isinstance(qo_offset, int) else qo_offset)
        for i in range(ql):
            pos = off + i
            for h in range(hq):
                g = h // (hq // hkv)
                for j in range(kl):
                    if causal and j > pos:
                        break
                    if layout == "dense":
                        kv = kd[k0 + j, g]
                    else:
                        pg = int(table[b, j // BLK]) if table is not None else int(flat[p0 + j // BLK])
                        if not 0 <= pg < kd.shape[0]:  # a page id out of range is skipped
                            continue
                        kv = kd[pg, j % BLK, g] if layout != "head_major" else kd[pg, g, j % BLK]
                    s = float((qd[t, h] * kv).sum())
                    out[t, h, j // BLK] = max(out[t, h, j // BLK], s)
            t += 1
        k0 += kl
        p0 += -(-kl // BLK)
    return out


@pytest.mark.parametrize("layout", ["dense", "token_major", "head_major", "flat"])
@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_float64_loop(layout, causal, reference_backend):
    q_lens, kv_lens = [2, 3, 0], [130, 5, 40]
    info, q, k, kw = make_case(q_lens, kv_lens, 2, 1, 16, torch.bfloat16, "cpu", layout=layout, causal=causal)
    _, ms = msa(q, k, None, info, output_o=False, **kw)
    ref = loop_max_score(q, k, q_lens, kv_lens, layout, kw, causal=causal)
    assert_close(ms, ref.float(), atol=ATOL, rtol=RTOL)


CASES = [
    # q_lens, kv_lens, hq, hkv: ragged, non-multiple-of-128 lengths, an empty request,
    # q_len 0, GQA 3 (not a power of two), a context of a single key
    ([3, 70, 0], [300, 200, 129], 2, 2),
    ([5, 1, 40], [5, 1, 257], 6, 2),
]


@pytest.mark.parametrize("layout", ["dense", "token_major", "head_major", "flat"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_reference(layout, dtype, device, triton_backend, monkeypatch):
    q_lens, kv_lens, hq, hkv = CASES[DTYPES.index(dtype) % 2]
    info, q, k, kw = make_case(q_lens, kv_lens, hq, hkv, 64, dtype, device, layout=layout)
    tiles = info.plan.max_k_tiles + 1  # a wider buffer: the extra column must become -inf
    buf = poisoned((q.shape[0], hq, tiles), torch.float32, device)
    _, ms = msa(q, k, None, info, output_o=False, max_score=buf, **kw)
    assert ms is buf
    monkeypatch.setenv("MATE_BACKEND", "reference")
    _, ref = msa(q, k, None, info, output_o=False, max_score=torch.empty_like(buf), **kw)
    q_abs, k_abs = (x.float().abs().to(dtype) for x in (q, k))  # exact: |x| of an fp8 / fp16 value
    _, ref_abs = msa(q_abs, k_abs, None, info, output_o=False, max_score=torch.empty_like(buf), **kw)
    assert_scores_close(ms, ref, ref_abs, dtype, device)
    assert torch.isinf(ms[:, :, -1]).all()


@pytest.mark.parametrize("layout", ["token_major", "head_major", "flat"])
def test_out_of_range_pages_are_skipped(layout, device, triton_backend, monkeypatch):
    """Page ids -1, >= the cache's pages and huge ones in the table or the flat list: the
    kernel never reads them (their blocks are -inf, as in the reference and the float64 loop),
    the other blocks are unchanged."""
    q_lens, kv_lens = [3, 2], [300, 200]
    info, q, k, kw = make_case(q_lens, kv_lens, 4, 2, 64, torch.bfloat16, device, layout=layout)
    ids = kw["page_table"] if layout != "flat" else kw["kv_indices"]
    bad = [(0, 1, -1), (1, 0, k.shape[0]), (1, 1, 2**31 - 1)] if layout != "flat" else \
        [(None, 1, -1), (None, 3, k.shape[0] + 7)]
    for b, j, val in bad:
        if b is None:
            ids[j] = val
        else:
            ids[b, j] = val
    buf = poisoned((q.shape[0], 4, info.plan.max_k_tiles), torch.float32, device)
    _, ms = msa(q, k, None, info, output_o=False, max_score=buf, **kw)
    monkeypatch.setenv("MATE_BACKEND", "reference")
    _, ref = msa(q, k, None, info, output_o=False, max_score=torch.empty_like(buf), **kw)
    assert_close(ms, ref, **_tol(torch.bfloat16, device))
    loop = loop_max_score(q, k, q_lens, kv_lens, layout, {n: t.cpu() for n, t in kw.items()})
    assert_close(ref.cpu(), loop.float(), atol=ATOL, rtol=RTOL)
    assert torch.isinf(ms[:3, :, 1]).all() if layout != "flat" else torch.isinf(ms[3:, :, 0]).all()


@pytest.mark.parametrize("layout,causal", [("token_major", True), ("dense", False), ("flat", True)])
def test_prefill_256_row_tiles(layout, causal, device, triton_backend, monkeypatch):
    """The 256-row prefill configuration (16 warps) equals the reference: two row tiles,
    whole and diagonal key tiles, a request ending inside a tile, GQA 2."""
    from mate.ops.msa import maxscore

    monkeypatch.setattr(maxscore, "PREFILL_BLOCK_M", 256)
    info, q, k, kw = make_case([150, 3], [400, 140], 2, 1, 64, torch.bfloat16, device, layout=layout, causal=causal)
    buf = poisoned((q.shape[0], 2, info.plan.max_k_tiles), torch.float32, device)
    msa(q, k, None, info, output_o=False, max_score=buf, **kw)
    monkeypatch.setenv("MATE_BACKEND", "reference")
    _, ref = msa(q, k, None, info, output_o=False, max_score=torch.empty_like(buf), **kw)
    assert_close(buf, ref, atol=ATOL, rtol=RTOL)  # also checks the -inf pattern exactly


@pytest.mark.parametrize("causal", [True, False])
def test_kernel_offsets_and_overrides(causal, device, triton_backend, monkeypatch):
    q_lens, kv_lens = [4, 70], [260, 140]
    off = torch.tensor([-2, 100])
    info, q, k, kw = make_case(q_lens, kv_lens, 2, 1, 64, torch.bfloat16, device, layout="token_major",
                               qo_offset=off, causal=causal)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("MATE_BACKEND", backend)
        r1 = msa(q, k, None, info, output_o=False, **kw)[1]
        r2 = msa(q, k, None, info, output_o=False, q_offset_override=130, **kw)[1]
        r3 = msa(q, k, None, info, output_o=False, q_offset_override=off.int().flip(0).to(device), **kw)[1]
        results.append((r1, r2, r3))
    for a, b in zip(*results):
        assert_close(a, b, atol=ATOL, rtol=RTOL)
    # the plan's offsets and both overrides as an independent loop computes them
    kw_cpu = {n: t.cpu() for n, t in kw.items()}
    for got, offsets in zip(results[0], (off, 130, off.flip(0))):
        want = loop_max_score(q, k, q_lens, kv_lens, "token_major", kw_cpu, causal, offsets).float()
        assert_close(got.cpu(), want, atol=ATOL, rtol=RTOL)


_STATIC_Q_LENS, _STATIC_KV_LENS = [1, 2, 150], [300, 129, 256]


def _static_case(device):
    """Three paged requests (``_STATIC_Q_LENS`` / ``_STATIC_KV_LENS``, 2 KV heads) with their
    eager plan, a static plan of the same capacity and its runtime metadata (the eager plan's
    lengths, a 4-column page table): (info, q, k, kw, static, rt)."""
    info, q, k, kw = make_case(_STATIC_Q_LENS, _STATIC_KV_LENS, 2, 2, 64, torch.bfloat16, device,
                               layout="token_major")
    p = info.plan
    static = msa_plan(3, 150, 300, 2, num_kv_heads=2, page_size=BLK, output_maxscore=True)
    pt = torch.zeros(3, 4, dtype=torch.int32, device=device)
    pt[:, : kw["page_table"].shape[1]] = kw["page_table"]
    rt = MsaRuntimeMetadata(None, None, None, p.prefill_plan.cu_seqlens_q, p.prefill_plan.cu_seqlens_k,
                            page_table=pt, seqused_k=p.kv_lens)
    return info, q, k, kw, static, rt


def test_static_plan_runtime_metadata_and_mixed_plan(device, triton_backend):
    """A static plan with runtime metadata and a mixed (decode + prefill) plan both equal
    the single eager plan."""
    info, q, k, kw, static, rt = _static_case(device)
    q_lens, kv_lens = _STATIC_Q_LENS, _STATIC_KV_LENS
    _, ref = msa(q, k, None, info, output_o=False, **kw)
    buf = poisoned(ref.shape, torch.float32, device)
    msa(q, k, None, static, output_o=False, runtime_metadata=rt, max_score=buf)
    assert_close(buf, ref, atol=0, rtol=0)
    mixed = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), 2, 2, page_size=BLK,
                                   output_maxscore=True, device=device)
    assert mixed.has_mixed_prefill and mixed.split == 2
    _, ms = msa(q, k, None, mixed, output_o=False, **kw)
    # the decode part runs 64-row tiles, the eager plan 128 / 256: the dot products may be summed in
    # another order (under the interpreter numpy's blocking differs by shape: 1 ulp seen in CI)
    assert_close(ms, ref, atol=ATOL, rtol=RTOL)


def test_max_score_must_not_overlap_runtime_metadata(device):
    """A max_score buffer sharing memory with a runtime lengths tensor the pass reads raises,
    naming it (the kernels would race); the same call with separate buffers runs."""
    info, q, k, kw, static, rt = _static_case(device)
    tiles = static.plan.max_k_tiles
    rows = sum(_STATIC_Q_LENS)
    store = torch.zeros(rows * 2 * tiles + 8, dtype=torch.float32, device=device)
    buf = store[:-8].view(rows, 2, tiles)
    seqused = store[-8:].view(torch.int32)[:3]  # disjoint from buf
    seqused.copy_(info.plan.kv_lens)
    rt.seqused_k = seqused
    msa(q, k, None, static, output_o=False, runtime_metadata=rt, max_score=buf)
    inside = buf.view(-1)[-4:].view(torch.int32)[:3]  # the last elements of buf itself
    inside.copy_(info.plan.kv_lens)
    rt.seqused_k = inside
    with pytest.raises(ValueError, match="max_score must not overlap runtime_metadata.seqused_k"):
        msa(q, k, None, static, output_o=False, runtime_metadata=rt, max_score=buf)


# ----------------------------------------------------------------------------- GPU


def _blocked_oracle(q, k_dense, q_len, kv_len, hq, hkv, tiles, chunk=2048):
    """Per-request fp32 matmul oracle (GPU, no TF32) for one request with dense K [kv_len, Hkv, D]."""
    out = torch.full((q_len, hq, tiles), -math.inf, device=q.device)
    ratio = hq // hkv
    kf = k_dense.float()
    for t0 in range(0, q_len, chunk):
        t1 = min(q_len, t0 + chunk)
        qf = q[t0:t1].float()
        for h in range(hq):
            s = qf[:, h] @ kf[:, h // ratio].t()  # [n, kv_len]
            pos = kv_len - q_len + torch.arange(t0, t1, device=q.device)
            s = torch.where(torch.arange(kv_len, device=q.device)[None, :] <= pos[:, None], s, -math.inf)
            pad = tiles * BLK - kv_len
            s = torch.nn.functional.pad(s, (0, pad), value=-math.inf)
            out[t0:t1, h] = s.view(t1 - t0, tiles, BLK).amax(-1)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("q_len,kv_len,batch,head_major", [(32768, 32768, 1, False), (2048, 131072, 1, True),
                                                           (1, 131072, 4, False), (1, 65536, 64, True)])
def test_gpu_long_contexts(q_len, kv_len, batch, head_major):
    torch.backends.cuda.matmul.allow_tf32 = False
    hq = hkv = 4
    d = 128
    dev = "cuda"
    tiles = -(-kv_len // BLK)
    pages = batch * tiles
    perm = torch.randperm(pages, device=dev).int()
    table = perm.view(batch, tiles)
    k = torch.randn(pages, BLK, hkv, d, device=dev).bfloat16()
    if head_major:
        k = k.transpose(1, 2).contiguous()
    q = torch.randn(batch * q_len, hq, d, device=dev).bfloat16()
    info = _msa_plan_from_lengths(torch.full((batch,), q_len), torch.full((batch,), kv_len), hq, hkv, page_size=BLK,
                                  output_maxscore=True, device=dev)
    _, ms = msa(q, k, None, info, output_o=False, page_table=table)
    for b in range(batch):  # every request (each has its own pages)
        kd = k[table[b].long()]
        kd = (kd.transpose(1, 2) if head_major else kd).reshape(tiles * BLK, hkv, d)[:kv_len]
        ref = _blocked_oracle(q[b * q_len:(b + 1) * q_len], kd, q_len, kv_len, hq, hkv, tiles)
        # fp32 accumulation of 128 bf16 products: tensor-core vs cuBLAS summation order
        assert_close(ms[b * q_len:(b + 1) * q_len], ref, atol=1e-3, rtol=1e-4)


def _static_dense_max_score(q, k, cu_q, cu_k, used, buf, causal):
    info = msa_plan(cu_q.numel() - 1, 4, 256, q.shape[1], num_kv_heads=k.shape[1], output_maxscore=True,
                    causal=causal)
    rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used)
    msa(q, k, None, info, output_o=False, runtime_metadata=rt, max_score=buf)


@pytest.mark.parametrize("causal", [False, True])
def test_dense_lengths_outside_the_tensors(device, triton_backend, causal):
    """Static dense plan, device lengths outside q / k (keys past k, a key range starting
    before k's first row, seqused_k up to 2**30, requests running past q or starting before it):
    keys past k are skipped and a range starting before k sees none, rows outside q are neither
    read nor written (exact-size views of larger buffers whose other rows would show up in the
    maxima); every row inside q equals the reference."""
    from mate.ops.msa.reference_select import max_score_reference

    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    d = 32
    kbig = (torch.randn(512, 1, d, generator=g) * 0.3).to(torch.bfloat16).to(device)
    kbig[:128] = 30.0  # rows before k
    kbig[256:] = 30.0  # rows after k
    k = kbig[128:256]
    qbig = torch.randn(6, 2, d, generator=g).to(torch.bfloat16).to(device)
    cases = [  # total_q, cu_seqlens_q, cu_seqlens_k, seqused_k, output tiles
        (2, i32(0, 2), i32(0, 128), i32(256), 2),  # keys past k
        (2, i32(0, 2), i32(-64, 0), i32(200), 2),  # keys before row 0 of k
        (2, i32(0, 2), i32(0, 128), i32(2**30), 8),  # a huge length: bounded by k's rows
        (2, i32(0, 4), i32(0, 128), i32(128), 2),  # the request runs past q
        (2, i32(2**28, 2**28 + 1), i32(0, 128), i32(128), 2),  # the request lies past q
        (2, i32(-1, 2), i32(0, 128), i32(128), 2),  # the request starts before q: not computed
    ]
    for total_q, cu_q, cu_k, used, tiles in cases:
        q = qbig[:total_q]
        big = poisoned((4, 2, tiles), torch.float32, device)
        buf = big[:total_q]
        _static_dense_max_score(q, k, cu_q, cu_k, used, buf, causal)
        ref = max_score_reference(q, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, kv_lens=used, qo_offset=None,
                                  page_table=None, kv_indices=None, kv_page_indptr=None, qo_offset_value=None,
                                  causal=causal, layout=0, batch_size=1, max_seqlen_q=4, num_k_tiles=tiles)
        covered = ref.isfinite().any(-1).any(-1)
        name = f"cu_q={cu_q.tolist()} cu_k={cu_k.tolist()} used={used.tolist()}"
        assert_close(buf[covered], ref[covered], atol=ATOL, rtol=RTOL, name=name)
        starts = cu_q[0].item()
        if starts < 0 or starts >= total_q:  # no row of q is the request's: none written
            assert torch.isnan(buf).all(), f"{name}: rows written"
        elif cu_k[0].item() < 0:  # a key range starting before k's first row: no key seen
            assert torch.isinf(buf).all() and (buf < 0).all(), name
        assert torch.isnan(big[total_q:]).all(), f"{name}: rows past max_score written"
        assert bool((ref.nan_to_num(neginf=0) < 30.0 * 30.0 * d / 10).all()), f"{name}: reference read outside k"


def test_eager_plan_checks_q_and_k_rows(device):
    info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([256]), num_qo_heads=2, causal=False,
                                  output_maxscore=True, device=device)
    q = torch.zeros(4, 2, 32, dtype=torch.bfloat16, device=device)
    k = torch.zeros(256, 2, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"q.*\[4 \(the plan's query tokens\)"):
        msa(q[:2], k, None, info, output_o=False)
    with pytest.raises(ValueError, match=r"k.*\[>= 256 \(the plan's key rows\)"):
        msa(q, k[:128], None, info, output_o=False)
