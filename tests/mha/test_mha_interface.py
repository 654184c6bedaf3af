"""mate.mha_interface: the reference against a float64 loop, the Triton kernel against the
reference (interpreter on CPU, H200 in the GPU suite), FA3 conventions and errors."""

from __future__ import annotations

import math

import pytest
import torch

from mate.mha_interface import flash_attn_varlen_func, flash_attn_with_kvcache, get_scheduler_metadata
from mate.ops.mha.reference import attention_varlen_reference
from mate.testing import assert_close, assert_equal, poisoned
from tests._markers import interpreter_only

# bf16 output: 2^-8 relative resolution, plus P rounded to bf16 before PV: ~2-3 ulps.
# fp16: 2^-11. LSE: fp32 math on the same logits, differences of accumulation order only.
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (3e-3, 3e-3)}
LSE_TOL = dict(atol=1e-4, rtol=1e-4)


def cu(lens, device):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)


def paged_cache(k_lens, hkv, d, page_size, dtype, device, g):
    """A shuffled paged cache holding each request's keys, plus the ragged original."""
    npages = [-(-n // page_size) for n in k_lens]
    total_pages = sum(npages) + 2
    perm = torch.randperm(total_pages, generator=g)
    kc = torch.randn(total_pages, page_size, hkv, d, generator=g).to(dtype)
    vc = torch.randn(total_pages, page_size, hkv, d, generator=g).to(dtype)
    table = torch.zeros(len(k_lens), max(npages) + 1, dtype=torch.int32)
    p = 0
    for i, n in enumerate(npages):
        table[i, :n] = perm[p:p + n].to(torch.int32)
        p += n
    return kc.to(device), vc.to(device), table.to(device)


def loop_attention(q, k, v, cu_q, k_lens, k_starts, scale, causal, window):
    """float64 loops over queries, heads and keys, bottom-right aligned masks."""
    total_q, hq, d = q.shape
    ratio = hq // k.shape[1]
    out = torch.zeros(total_q, hq, d, dtype=torch.float64)
    lse = torch.full((hq, total_q), -math.inf, dtype=torch.float64)
    left, right = window
    if causal:
        right = 0
    for i in range(len(k_lens)):
        q0, q1 = int(cu_q[i]), int(cu_q[i + 1])
        for j in range(q1 - q0):
            pos = j + k_lens[i] - (q1 - q0)
            for h in range(hq):
                ls, vs = [], []
                for n in range(k_lens[i]):
                    if (right >= 0 and n > pos + right) or (left >= 0 and n < pos - left):
                        continue
                    kk = k[k_starts[i] + n, h // ratio].double()
                    ls.append(float((q[q0 + j, h].double() * kk).sum()) * scale)
                    vs.append(v[k_starts[i] + n, h // ratio].double())
                if ls:
                    s = torch.tensor(ls, dtype=torch.float64)
                    p = torch.exp(s - s.max())
                    out[q0 + j, h] = (p[:, None] * torch.stack(vs)).sum(0) / p.sum()
                    lse[h, q0 + j] = s.max() + torch.log(p.sum())
    return out, lse


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (2, 1)), (True, (3, -1))])
def test_reference_matches_float64_loop(causal, window, random_seed):
    g = torch.Generator().manual_seed(random_seed)
    q_lens, k_lens = [3, 4], [5, 2]
    q = torch.randn(7, 4, 16, generator=g, dtype=torch.float64)
    k = torch.randn(7, 2, 16, generator=g, dtype=torch.float64)
    v = torch.randn(7, 2, 16, generator=g, dtype=torch.float64)
    cq = cu(q_lens, "cpu")
    out, lse = attention_varlen_reference(q, k, v, cq, k_lens, k_starts=[0, 5], softmax_scale=0.3, causal=causal,
                                          window_size=window, compute_dtype=torch.float64)
    ro, rl = loop_attention(q, k, v, cq, k_lens, [0, 5], 0.3, causal, window)
    assert_close(out, ro, atol=1e-10, rtol=1e-10)  # float64 both sides: summation order only
    assert_close(lse, rl, atol=1e-10, rtol=1e-10)
    assert torch.isinf(rl).any()  # request 2 has queries before its first key (bottom-right causal)


@pytest.mark.parametrize(
    "dtype,hq,hkv,d,causal,window,seqused",
    [
        (torch.bfloat16, 8, 2, 64, True, (-1, -1), False),
        (torch.float16, 4, 4, 128, False, (-1, -1), True),
        (torch.bfloat16, 6, 2, 32, True, (20, -1), False),
        (torch.float16, 2, 1, 64, False, (5, 3), True),
    ],
)
def test_varlen_dense_matches_reference(device, triton_backend, dtype, hq, hkv, d, causal, window, seqused):
    check_varlen_dense(device, dtype, hq, hkv, d, causal, window, seqused)


def check_varlen_dense(device, dtype, hq, hkv, d, causal, window, seqused):
    """Three ragged requests (one empty, one with more queries than a 64-key tile) against the
    reference, output and LSE."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens, k_lens = [5, 0, 70], [40, 9, 130]
    used = [33, 0, 127] if seqused else k_lens
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype).to(device)
    k = torch.randn(sum(k_lens), hkv, d, generator=g).to(dtype).to(device)
    v = torch.randn(sum(k_lens), hkv, d, generator=g).to(dtype).to(device)
    out = poisoned((sum(q_lens), hq, d), dtype, device)
    su = torch.tensor(used, dtype=torch.int32, device=device) if seqused else None
    o, lse = flash_attn_varlen_func(q, k, v, cu(q_lens, device), cu(k_lens, device), max(q_lens), max(k_lens),
                                    seqused_k=su, causal=causal, window_size=window, return_softmax_lse=True,
                                    out=out)
    assert o is out
    ro, rl = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu(q_lens, "cpu"), used,
                                        k_starts=cu(k_lens, "cpu").tolist()[:-1], causal=causal, window_size=window)
    atol, rtol = TOL[dtype]
    assert_close(o, ro, atol=atol, rtol=rtol)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.parametrize("variant", [{}, {"rows": 64, "split_loop": False}, {"rows": 128, "split_loop": True},
                                     {"rows": 128, "split_loop": False}])
def test_prefill_variants_match_reference(device, triton_backend, monkeypatch, variant):
    """The packed-heads kernel on prefill (the TMA kernel turned off) in the tilings of
    ``PREFILL_VARIANT``: the default (64-row programs whose fully visible key tiles run without
    masks), 128-row programs, and every key tile masked (causal, full and right-window
    attention, seqused_k, GQA, the batched cache of flash_attn_with_kvcache; left windows keep
    the masked loop)."""
    from mate.ops.mha import attention, prefill_tma

    monkeypatch.setitem(prefill_tma.PREFILL_TMA, "enabled", False)
    for key, value in variant.items():
        monkeypatch.setitem(attention.PREFILL_VARIANT, key, value)
    check_varlen_dense(device, torch.bfloat16, 8, 2, 64, True, (-1, -1), False)
    check_varlen_dense(device, torch.float16, 4, 4, 128, False, (-1, -1), True)
    check_varlen_dense(device, torch.bfloat16, 4, 2, 64, False, (-1, 5), True)  # right window: split loop
    check_varlen_dense(device, torch.float16, 2, 1, 64, False, (5, 3), True)  # left windows: masked loop only
    check_varlen_dense(device, torch.bfloat16, 6, 2, 32, True, (20, -1), False)
    check_kvcache(device, paged=False, sq=70)


@pytest.mark.parametrize("block_m,block_n,heads_inner,virtual_grid", [(16, 16, False, 1), (32, 16, True, 1),
                                                                      (16, 16, True, 0)])
def test_prefill_tma_matches_reference(device, triton_backend, monkeypatch, block_m, block_n, heads_inner,
                                       virtual_grid):
    """The TMA prefill kernel (``prefill_tma``: one query head per program), on small tiles so the
    interpreter runs it, through the checks of the other kernel: ragged, seqused_k, batched and
    paged caches (page sizes multiples of the key tile; pages outside the cache), causal, full and
    right-window attention, GQA, fp16 / bf16, D 64 / 128, requests without queries, offsets outside
    the tensors, lengths near INT32_MAX. Every check makes at least one call through it (counted);
    left windows and page sizes below the key tile keep the other kernel."""
    from mate.ops.mha import attention, prefill_tma

    for key, value in (("block_m", block_m), ("block_n", block_n), ("min_seqlen_q", 1), ("heads_inner", heads_inner),
                       ("virtual_grid", virtual_grid)):
        monkeypatch.setitem(prefill_tma.PREFILL_TMA, key, value)
    calls = []
    real = attention.attention_prefill_tma
    monkeypatch.setattr(attention, "attention_prefill_tma", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    checks = [
        lambda: check_varlen_dense(device, torch.bfloat16, 8, 2, 64, True, (-1, -1), False),
        lambda: check_varlen_dense(device, torch.float16, 4, 4, 128, False, (-1, -1), True),
        lambda: check_varlen_dense(device, torch.bfloat16, 4, 2, 64, False, (-1, 5), True),
        lambda: check_varlen_dense(device, torch.float16, 6, 3, 64, True, (-1, 0), False),
        lambda: check_offsets_outside_the_tensors(device),
        lambda: check_kvcache(device, paged=False, sq=3),
        lambda: check_kvcache(device, paged=True, sq=3),
        lambda: check_varlen_paged(device, 16),
        lambda: check_varlen_paged(device, 64),
        lambda: check_paged_bad_pages(device),
        lambda: check_lengths_near_int32_max(device),
    ]
    for i, check in enumerate(checks):
        before = len(calls)
        check()
        assert len(calls) > before, f"check {i} did not reach the TMA kernel"
    before = len(calls)
    check_varlen_dense(device, torch.float16, 2, 1, 64, False, (5, 3), True)  # a left window: the other kernel
    assert len(calls) == before


@pytest.mark.parametrize("paged,tma", [(False, True), (True, True), (True, False)])
def test_mixed_batch_splits_short_requests(device, triton_backend, monkeypatch, paged, tma):
    """A ragged batch mixing decode rows and short chunks into a prefill: the TMA kernel takes the
    requests of ``min_seqlen_q`` queries or more and skips the rest (left poisoned when it runs
    alone); the packed-heads kernel fills in the rest in two launches, the decode rows and the
    longer requests, each tiled for its class. With the TMA kernel off the packed-heads kernel's
    two launches cover the batch. The whole call matches the reference."""
    from mate.ops.mha import attention, prefill_tma

    for key, value in (("block_m", 16), ("block_n", 16), ("min_seqlen_q", 16), ("enabled", tma), ("virtual_grid", 1)):
        monkeypatch.setitem(prefill_tma.PREFILL_TMA, key, value)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens, k_lens = [5, 0, 40, 1, 16, 15, 9], [37, 9, 70, 20, 16, 64, 30]
    hq, hkv, d = 4, 2, 64
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16).to(device)
    cq = cu(q_lens, device)
    if paged:
        kc, vc, table = paged_cache(k_lens, hkv, d, 16, torch.bfloat16, device, g)
        kv = dict(k=kc, v=vc, cu_seqlens_k=None, max_seqlen_k=None, page_table=table,
                  seqused_k=torch.tensor(k_lens, dtype=torch.int32, device=device))
        ref_kv = dict(k=kc.cpu(), v=vc.cpu(), page_table=table.cpu())
    else:
        k = torch.randn(sum(k_lens), hkv, d, generator=g).to(torch.bfloat16).to(device)
        v = torch.randn(sum(k_lens), hkv, d, generator=g).to(torch.bfloat16).to(device)
        kv = dict(k=k, v=v, cu_seqlens_k=cu(k_lens, device), max_seqlen_k=max(k_lens))
        ref_kv = dict(k=k.cpu(), v=v.cpu(), k_starts=cu(k_lens, "cpu").tolist()[:-1])
    ro, rl = attention_varlen_reference(q.cpu(), cu_seqlens_q=cu(q_lens, "cpu"), k_lens=k_lens, causal=True,
                                        **ref_kv)
    bounds = cq.tolist()

    def rows(keep):
        return torch.cat([torch.arange(a, b) for a, b, n in zip(bounds[:-1], bounds[1:], q_lens) if keep(n)])

    min_qs, packed = [], []
    real_tma, real_packed = attention.attention_prefill_tma, attention._launch_packed

    def tma_alone(*args, **kw):  # the TMA kernel alone into a poisoned output: short rows stay NaN
        min_qs.append(kw["min_q"])
        alone = poisoned(args[3].shape, args[3].dtype, device)
        real_tma(args[0], args[1], args[2], alone, args[4].clone(), **kw)
        assert torch.isnan(alone[rows(lambda n: n < 16).to(device)]).all()
        assert_close(alone[rows(lambda n: n >= 16).to(device)], ro[rows(lambda n: n >= 16)], atol=2e-2, rtol=2e-2)
        return real_tma(*args, **kw)

    def packed_launch(*args, **kw):  # alone into a poisoned output: only its class's rows are written
        lo, hi = kw["q_len_min"], kw["q_len_max"]
        packed.append((lo, hi, kw["tile_q"]))
        alone = poisoned(args[3].shape, args[3].dtype, device)
        real_packed(args[0], args[1], args[2], alone, args[4].clone(), **kw)
        mine = rows(lambda n: lo <= n <= hi and n > 0)
        assert torch.isnan(alone[rows(lambda n: not lo <= n <= hi).to(device)]).all()
        assert_close(alone[mine.to(device)], ro[mine], atol=2e-2, rtol=2e-2)
        return real_packed(*args, **kw)

    monkeypatch.setattr(attention, "attention_prefill_tma", tma_alone)
    monkeypatch.setattr(attention, "_launch_packed", packed_launch)
    out = poisoned((sum(q_lens), hq, d), torch.bfloat16, device)
    o, lse = flash_attn_varlen_func(q, cu_seqlens_q=cq, max_seqlen_q=max(q_lens), causal=True,
                                    return_softmax_lse=True, out=out, **kv)
    assert min_qs == ([16] if tma else [])
    assert packed == ([(0, 1, 1), (2, 15, 15)] if tma else [(0, 1, 1), (2, 2**31 - 1, 40)])
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.parametrize("page_size", [16, 64, 128])
def test_varlen_paged_matches_reference(device, triton_backend, page_size):
    check_varlen_paged(device, page_size)


def check_varlen_paged(device, page_size):
    """Paged varlen (seqused_k) over a shuffled cache, against the reference."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens, k_lens = [1, 6, 3], [100, 200, 3]
    hq, hkv, d = 8, 2, 64
    kc, vc, table = paged_cache(k_lens, hkv, d, page_size, torch.bfloat16, device, g)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16).to(device)
    su = torch.tensor(k_lens, dtype=torch.int32, device=device)
    o, lse = flash_attn_varlen_func(q, kc, vc, cu(q_lens, device), None, max(q_lens), None, seqused_k=su,
                                    page_table=table, causal=True, return_softmax_lse=True)
    ro, rl = attention_varlen_reference(q.cpu(), kc.cpu(), vc.cpu(), cu(q_lens, "cpu"), k_lens,
                                        page_table=table.cpu(), causal=True)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.parametrize("paged,sq", [(False, 1), (True, 1), (True, 3)])
def test_kvcache_matches_reference(device, triton_backend, paged, sq):
    check_kvcache(device, paged, sq)


def check_kvcache(device, paged, sq):
    """Three requests of ``sq`` queries over a paged or batched cache, against the reference."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b, hq, hkv, d, s_cache = 3, 16, 2, 64, 160
    lens = [160, 7, 65]
    q = torch.randn(b, sq, hq, d, generator=g).to(torch.float16).to(device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    meta = get_scheduler_metadata(b, sq, s_cache, hq, hkv, d, qkv_dtype=torch.float16, causal=True)
    if paged:
        kc, vc, table = paged_cache(lens, hkv, d, 32, torch.float16, device, g)
        o, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=True,
                                         return_softmax_lse=True, scheduler_metadata=meta)
        ro, rl = attention_varlen_reference(q.reshape(b * sq, hq, d).cpu(), kc.cpu(), vc.cpu(),
                                            cu([sq] * b, "cpu"), lens, page_table=table.cpu(), causal=True)
    else:
        kc = torch.randn(b, s_cache, hkv, d, generator=g).to(torch.float16).to(device)
        vc = torch.randn(b, s_cache, hkv, d, generator=g).to(torch.float16).to(device)
        o, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, return_softmax_lse=True,
                                         scheduler_metadata=meta)
        ro, rl = attention_varlen_reference(q.reshape(b * sq, hq, d).cpu(), kc.cpu(), vc.cpu(),
                                            cu([sq] * b, "cpu"), lens, batched=True, causal=True)
    assert o.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    assert_close(o.reshape(b * sq, hq, d), ro, atol=3e-3, rtol=3e-3)
    assert_close(lse, rl.view(hq, b, sq).permute(1, 0, 2), name="lse", **LSE_TOL)


def test_reference_backend_on_cpu_matches(reference_backend):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q = torch.randn(4, 2, 32, generator=g).to(torch.bfloat16)
    k = torch.randn(6, 1, 32, generator=g).to(torch.bfloat16)
    v = torch.randn(6, 1, 32, generator=g).to(torch.bfloat16)
    o = flash_attn_varlen_func(q, k, v, cu([4], "cpu"), cu([6], "cpu"), 4, 6, causal=True)
    ro, _ = attention_varlen_reference(q, k, v, cu([4], "cpu"), [6], k_starts=[0], causal=True)
    assert_close(o, ro)


def test_softmax_scale_reaches_the_kernel(device, triton_backend):
    """A random softmax_scale (a kernel that dropped it would use D^-1/2), ragged and paged."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    scale = float(torch.rand(1, generator=g)) * 0.4 + 0.02
    q = torch.randn(7, 4, 64, generator=g).to(torch.bfloat16).to(device)
    k, v = (torch.randn(9, 2, 64, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    o = flash_attn_varlen_func(q, k, v, cu([3, 4], device), cu([5, 4], device), 4, 5, softmax_scale=scale,
                               causal=True)
    ro, _ = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu([3, 4], "cpu"), [5, 4], k_starts=[0, 5],
                                       softmax_scale=scale, causal=True)
    assert_close(o, ro, atol=2e-2, rtol=2e-2, name=f"softmax_scale={scale}")
    kc, vc, table = paged_cache([40, 17], 2, 64, 16, torch.bfloat16, device, g)
    qd = torch.randn(2, 1, 4, 64, generator=g).to(torch.bfloat16).to(device)
    seqlens = torch.tensor([40, 17], dtype=torch.int32, device=device)
    o = flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, page_table=table, softmax_scale=scale)
    ro, _ = attention_varlen_reference(qd.reshape(2, 4, 64).cpu(), kc.cpu(), vc.cpu(), cu([1, 1], "cpu"), [40, 17],
                                       page_table=table.cpu(), softmax_scale=scale)
    assert_close(o.reshape(2, 4, 64), ro, atol=2e-2, rtol=2e-2, name=f"paged softmax_scale={scale}")


def test_custom_op_opcheck(device, triton_backend):
    from mate.ops.mha.attention import mha_fwd_op

    q = torch.randn(3, 2, 16, device=device).to(torch.bfloat16)
    k = torch.randn(5, 1, 16, device=device).to(torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 3, device=device)
    torch.library.opcheck(mha_fwd_op.op, (q, k, k, out, lse, cu([3], device), 3, cu([5], device), None, None, False,
                                       0.25, -1, 0), test_utils=("test_schema", "test_faketensor"))
    # uniform queries without an offsets tensor: 3 requests of 1 query over a batched cache
    kb = torch.randn(3, 5, 1, 16, device=device).to(torch.bfloat16)
    torch.library.opcheck(mha_fwd_op.op, (q, kb, kb, out, lse, None, 1, None, None, None, True, 0.25, -1, 0, False, 3),
                          test_utils=("test_schema", "test_faketensor"))


def test_kvcache_builds_no_per_call_tensors(device, triton_backend, monkeypatch):
    """flash_attn_with_kvcache with q [B, S, H, D] hands the kernel no cu_seqlens_q (it computes
    the uniform offsets itself), and an int cache_seqlens as a scalar: no per-call tensor, no
    extra kernel in a captured graph."""
    import mate.mha_interface as mi

    seen = {}
    real = mi._run

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(mi, "_run", spy)
    check_kvcache(device, True, 2)
    assert seen["cu_seqlens_q"] is None and seen["batch"] == 3 and seen["max_seqlen_q"] == 2
    # an int cache_seqlens (or none, batched) reaches the kernel as a scalar, not a filled tensor
    q = torch.randn(2, 1, 4, 32, device=device).to(torch.float16)
    kc = torch.randn(2, 24, 1, 32, device=device).to(torch.float16)
    for lens, expect in ((17, 17), (None, 24)):
        seen.clear()
        o = flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens)
        assert seen["seqused_k"] is None and seen["k_uniform"] == expect
        ro, _ = attention_varlen_reference(q.reshape(2, 4, 32).cpu(), kc.cpu(), kc.cpu(), cu([1, 1], "cpu"),
                                           [expect] * 2, batched=True)
        assert_close(o.reshape(2, 4, 32), ro, atol=3e-3, rtol=3e-3, name=f"cache_seqlens={lens}")


@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_lengths_past_the_cache(device, triton_backend, causal):
    """Batched cache lengths past S_cache (tensor or int), 0 and negative: the keys past the
    cache are skipped (never read), as missing pages are; positions keep the given length."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b, hq, hkv, d, s_cache = 4, 8, 2, 64, 40
    q = torch.randn(b, 1, hq, d, generator=g).to(torch.float16).to(device)
    kc, vc = (torch.randn(b, s_cache, hkv, d, generator=g).to(torch.float16).to(device) for _ in range(2))
    lens = [s_cache + 5, 0, -5, s_cache + 1000]
    o, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=device),
                                     causal=causal, return_softmax_lse=True)
    ro, rl = attention_varlen_reference(q.reshape(b, hq, d).cpu(), kc.cpu(), vc.cpu(), cu([1] * b, "cpu"), lens,
                                        batched=True, causal=causal)
    # one query at position len - 1 >= S sees every cached key: the same as length S
    clamped = [min(max(n, 0), s_cache) for n in lens]
    rc, _ = attention_varlen_reference(q.reshape(b, hq, d).cpu(), kc.cpu(), vc.cpu(), cu([1] * b, "cpu"), clamped,
                                       batched=True, causal=causal)
    assert_equal(ro, rc)
    assert_close(o.reshape(b, hq, d), ro, atol=3e-3, rtol=3e-3)
    assert_close(lse.reshape(b, hq), rl.T, name="lse", **LSE_TOL)
    assert torch.isinf(lse[1:3]).all() and (o[1:3] == 0).all()
    o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=s_cache + 7, causal=causal)
    ro, _ = attention_varlen_reference(q.reshape(b, hq, d).cpu(), kc.cpu(), vc.cpu(), cu([1] * b, "cpu"),
                                       [s_cache] * b, batched=True, causal=causal)
    assert_close(o.reshape(b, hq, d), ro, atol=3e-3, rtol=3e-3, name="int cache_seqlens past S")


def test_varlen_offsets_outside_the_tensors(device, triton_backend):
    """Ragged offsets past q / k (a request running past total_q, a key range starting before
    row 0 or ending past total_k, seqused_k past its range): rows outside q are neither read nor
    written, keys outside k are skipped; every row inside q matches the reference."""
    check_offsets_outside_the_tensors(device)


def check_offsets_outside_the_tensors(device):
    """The body of :func:`test_varlen_offsets_outside_the_tensors`."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    hq, hkv, d = 4, 2, 64
    q = torch.randn(10, hq, d, generator=g).to(torch.bfloat16).to(device)
    k, v = (torch.randn(12, hkv, d, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    cq = torch.tensor([0, 4, 13], dtype=torch.int32, device=device)  # request 1: rows 4..12 of 10
    ck = torch.tensor([-3, 5, 90], dtype=torch.int32, device=device)  # keys -3..4 and 5..89 of 12
    for causal, seqused in ((True, None), (False, None), (True, [8, 200])):
        su = None if seqused is None else torch.tensor(seqused, dtype=torch.int32, device=device)
        out = poisoned((10, hq, d), torch.bfloat16, device)
        o, lse = flash_attn_varlen_func(q, k, v, cq, ck, 9, 85, causal=causal, out=out, seqused_k=su,
                                        return_softmax_lse=True)
        lens = [8, 85] if seqused is None else seqused
        ro, rl = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cq.cpu(), lens, k_starts=[-3, 5],
                                            causal=causal)
        assert_close(o, ro, atol=2e-2, rtol=2e-2, name=f"causal={causal} seqused={seqused}")
        assert_close(lse, rl, name="lse", **LSE_TOL)


def test_errors(device):
    q = torch.randn(4, 2, 64, dtype=torch.bfloat16, device=device)
    k = torch.randn(4, 1, 64, dtype=torch.bfloat16, device=device)
    cq = cu([4], device)
    with pytest.raises(NotImplementedError, match="softcap"):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, softcap=1.0)
    with pytest.raises(NotImplementedError, match="qv"):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, qv=q)
    with pytest.raises(TypeError, match="k must be"):
        flash_attn_varlen_func(q, k.half(), k.half(), cq, cq, 4, 4)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flash_attn_varlen_func(q, k, k, cq, None, 4, 4)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, window_size=(-2, 0))
    with pytest.raises(ValueError, match=r"window_size must be a pair of ints >= -1, got tensor"):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, window_size=torch.tensor([-1, -1]))
    with pytest.raises(ValueError, match=r"q.shape\[-1\] \(headdim\) must be one of"):
        flash_attn_varlen_func(q[..., :48], k[..., :48], k[..., :48], cq, cq, 4, 4)
    with pytest.raises(ValueError, match=r"k.shape\[-1\] \(headdim\) must be 64 \(q's headdim\), got 32"):
        flash_attn_varlen_func(q, k[..., :32], k[..., :32], cq, cq, 4, 4)
    with pytest.raises(ValueError, match=r"v must have shape \[4, 1, 64\], got \[4, 1, 32\]"):
        flash_attn_varlen_func(q, k, k[..., :32], cq, cq, 4, 4)
    with pytest.raises(ValueError, match="num_heads_k"):
        flash_attn_varlen_func(q[:, :1].expand(4, 3, 64), k.expand(4, 2, 64), k.expand(4, 2, 64), cq, cq, 4, 4)
    with pytest.raises(ValueError, match="out"):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, out=torch.empty(4, 2, 32, dtype=torch.bfloat16, device=device))
    kc = torch.zeros(2, 24, 1, 64, dtype=torch.bfloat16, device=device)
    table = torch.zeros(1, 2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="page_size"):
        flash_attn_with_kvcache(q[None, :1], kc, kc, cache_seqlens=3, page_table=table)
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        flash_attn_with_kvcache(q[None, :1], kc, kc, rotary_cos=q)
    with pytest.raises(ValueError, match="num_heads_kv"):
        get_scheduler_metadata(1, 1, 1, 6, 4, 64)
    meta = get_scheduler_metadata(1, 4, 4, 4, 1, 64)
    with pytest.raises(ValueError, match="scheduler_metadata.num_heads_q"):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, scheduler_metadata=meta)


def test_requests_past_the_grid_limit(device, triton_backend):
    """65536 requests do not fit a launch grid's y axis: a clear error before any launch (the
    reference backend has no such limit)."""
    n = 65536
    q = torch.zeros(n, 1, 64, dtype=torch.bfloat16, device=device)
    cq = torch.arange(n + 1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be at most 65535 requests per call, got 65536"):
        flash_attn_varlen_func(q, q, q, cq, cq, 1, 1)
    kc = torch.zeros(n, 1, 1, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"q.shape\[0\] \(batch\) must be at most 65535 requests per call, got 65536"):
        flash_attn_with_kvcache(q[:, None], kc, kc, cache_seqlens=1)


def test_kvcache_ragged_q(device, triton_backend):
    """Ragged queries over a paged cache (MSA's paged mode): out [total_q, Hq, D], lse [Hq, total_q]."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens, lens = [2, 0, 5], [130, 4, 5]
    hq, hkv, d = 4, 1, 128
    kc, vc, table = paged_cache(lens, hkv, d, 128, torch.bfloat16, device, g)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16).to(device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    o, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table,
                                     cu_seqlens_q=cu(q_lens, device), max_seqlen_q=5, causal=True,
                                     return_softmax_lse=True)
    ro, rl = attention_varlen_reference(q.cpu(), kc.cpu(), vc.cpu(), cu(q_lens, "cpu"), lens, page_table=table.cpu(),
                                        causal=True)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [None, {"rows": 128, "split_loop": True}, {"rows": 64, "split_loop": False}])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (300, -1))])
def test_varlen_gpu_random_lengths(causal, window, variant, monkeypatch):
    """Random ragged lengths with seqused_k at the M3 head shape: the default routing (the TMA
    kernel unless a left window), and the packed-heads kernel in the ``PREFILL_VARIANT`` tilings
    (128-row programs, every key tile masked)."""
    from mate.ops.mha import attention, prefill_tma

    if variant is not None:
        monkeypatch.setitem(prefill_tma.PREFILL_TMA, "enabled", False)
    for key, value in (variant or {}).items():
        monkeypatch.setitem(attention.PREFILL_VARIANT, key, value)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens = torch.randint(0, 700, (5,), generator=g).tolist()
    k_lens = [ql + int(torch.randint(0, 900, (1,), generator=g)) for ql in q_lens]
    used = [int(torch.randint(max(0, kl - 50), kl + 1, (1,), generator=g)) for kl in k_lens]
    hq, hkv, d = 32, 8, 128
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(sum(k_lens), hkv, d, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(sum(k_lens), hkv, d, generator=g).to(torch.bfloat16).cuda()
    su = torch.tensor(used, dtype=torch.int32, device="cuda")
    o, lse = flash_attn_varlen_func(q, k, v, cu(q_lens, "cuda"), cu(k_lens, "cuda"), max(q_lens), max(k_lens),
                                    seqused_k=su, causal=causal, window_size=window, return_softmax_lse=True)
    ro, rl = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu(q_lens, "cpu"), used,
                                        k_starts=cu(k_lens, "cpu").tolist()[:-1], causal=causal, window_size=window)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (-1, 300))])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (16, 16, 64)])
def test_prefill_tma_gpu(causal, window, hq, hkv, d):
    """The ragged dense prefill kernel at its default tiles: random lengths (one request without
    queries, one shorter than its keys), q / k / v as head slices of one fused qkv tensor (row
    stride (hq + 2 hkv) * d), against the reference; the call is counted to take that kernel."""
    from unittest import mock

    from mate.ops.mha import attention

    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens = [int(x) for x in torch.randint(128, 1500, (5,), generator=g)]
    q_lens[1] = 0
    k_lens = list(q_lens)
    k_lens[2] += 333
    total = max(sum(q_lens), sum(k_lens))
    qkv = torch.randn(total, hq + 2 * hkv, d, generator=g).to(torch.bfloat16).cuda()
    q, k, v = qkv[:sum(q_lens), :hq], qkv[:sum(k_lens), hq:hq + hkv], qkv[:sum(k_lens), hq + hkv:]
    out = poisoned((sum(q_lens), hq, d), torch.bfloat16, "cuda")
    with mock.patch.object(attention, "attention_prefill_tma", wraps=attention.attention_prefill_tma) as spy:
        o, lse = flash_attn_varlen_func(q, k, v, cu(q_lens, "cuda"), cu(k_lens, "cuda"), max(q_lens), max(k_lens),
                                        causal=causal, window_size=window, return_softmax_lse=True, out=out)
    assert spy.call_count == 1
    ro, rl = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu(q_lens, "cpu"), k_lens,
                                        k_starts=cu(k_lens, "cpu").tolist()[:-1], causal=causal, window_size=window)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [64, 128, None])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_tma_cache_gpu(page_size, causal):
    """The TMA prefill kernel over a shuffled paged cache (``page_size``; a page outside the cache
    in one request) or a batched one (None) through ``flash_attn_with_kvcache``: 200 new queries
    per request over 150-1100 cached keys, 32 / 8 heads, d 128, against the reference."""
    from unittest import mock

    from mate.ops.mha import attention

    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b, sq, hq, hkv, d = 4, 200, 32, 8, 128
    lens = [int(x) for x in torch.randint(150, 1100, (b,), generator=g)]
    q = torch.randn(b, sq, hq, d, generator=g).to(torch.bfloat16).cuda()
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    with mock.patch.object(attention, "attention_prefill_tma", wraps=attention.attention_prefill_tma) as spy:
        if page_size:
            kc, vc, table = paged_cache(lens, hkv, d, page_size, torch.bfloat16, "cuda", g)
            table[1, 1] = 10**6  # keys page_size..2 page_size - 1 of request 1 are skipped
            o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=causal)
            ro, _ = attention_varlen_reference(q.reshape(b * sq, hq, d).cpu(), kc.cpu(), vc.cpu(), cu([sq] * b, "cpu"),
                                               lens, page_table=table.cpu(), causal=causal)
        else:
            kc, vc = (torch.randn(b, 1100, hkv, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
            o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=causal)
            ro, _ = attention_varlen_reference(q.reshape(b * sq, hq, d).cpu(), kc.cpu(), vc.cpu(), cu([sq] * b, "cpu"),
                                               lens, batched=True, causal=causal)
    assert spy.call_count == 1
    assert_close(o.reshape(b * sq, hq, d), ro, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(64, 4), (32, 8)])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("virtual_grid", [None, 1])
def test_mixed_batch_gpu(paged, hq, hkv, virtual_grid, monkeypatch):
    """Decode rows and short chunks mixed into a prefill at the default thresholds (d 128,
    causal): the TMA kernel takes the requests of 64 queries or more, the packed-heads kernel
    the rest in two launches (the decode rows and the longer requests), against the reference;
    also with both kernels on the one axis of query blocks (``virtual_grid`` 1; the default
    keeps per-request axes for this batch)."""
    from mate.ops.mha import prefill_tma

    if virtual_grid is not None:
        monkeypatch.setitem(prefill_tma.PREFILL_TMA, "virtual_grid", virtual_grid)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    q_lens = [1, 300, 1, 17, 63, 64, 1, 700, 4, 3]
    k_lens = [int(torch.randint(n, n + 1500, (1,), generator=g)) for n in q_lens]
    d = 128
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16).cuda()
    if paged:
        kc, vc, table = paged_cache(k_lens, hkv, d, 128, torch.bfloat16, "cuda", g)
        kv = dict(k=kc, v=vc, page_table=table, seqused_k=torch.tensor(k_lens, dtype=torch.int32, device="cuda"))
        ref_kv = dict(k=kc.cpu(), v=vc.cpu(), page_table=table.cpu())
    else:
        k, v = (torch.randn(sum(k_lens), hkv, d, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        kv = dict(k=k, v=v, cu_seqlens_k=cu(k_lens, "cuda"), max_seqlen_k=max(k_lens))
        ref_kv = dict(k=k.cpu(), v=v.cpu(), k_starts=cu(k_lens, "cpu").tolist()[:-1])
    out = poisoned((sum(q_lens), hq, d), torch.bfloat16, "cuda")
    o, lse = flash_attn_varlen_func(q, cu_seqlens_q=cu(q_lens, "cuda"), max_seqlen_q=max(q_lens), causal=True,
                                    return_softmax_lse=True, out=out, **kv)
    ro, rl = attention_varlen_reference(q.cpu(), cu_seqlens_q=cu(q_lens, "cpu"), k_lens=k_lens, causal=True, **ref_kv)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, name="lse", **LSE_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 128])
def test_paged_decode_gpu(page_size):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    lens = torch.randint(1, 5000, (16,), generator=g).tolist()
    hq, hkv, d = 64, 4, 128
    kc, vc, table = paged_cache(lens, hkv, d, page_size, torch.bfloat16, "cuda", g)
    q = torch.randn(16, 2, hq, d, generator=g).to(torch.bfloat16).cuda()
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    o, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table, causal=True,
                                     return_softmax_lse=True)
    ro, rl = attention_varlen_reference(q.reshape(32, hq, d).cpu(), kc.cpu(), vc.cpu(), cu([2] * 16, "cpu"), lens,
                                        page_table=table.cpu(), causal=True)
    assert_close(o.reshape(32, hq, d), ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl.view(hq, 16, 2).permute(1, 0, 2), name="lse", **LSE_TOL)


@pytest.mark.gpu
def test_single_sequence_sdpa_path_gpu():
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    T, hq, hkv, d = 2048, 16, 4, 128
    q = torch.randn(T, hq, d, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(T, hkv, d, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(T, hkv, d, generator=g).to(torch.bfloat16).cuda()
    c = cu([T], "cuda")
    out = poisoned((T, hq, d), torch.bfloat16, "cuda")
    o = flash_attn_varlen_func(q, k, v, c, c, T, T, causal=True, out=out)
    assert o is out
    ro, _ = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu([T], "cpu"), [T], k_starts=[0], causal=True)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hkv,d", [(16, 16, 128), (32, 8, 64), (8, 2, 256)])
def test_single_sequence_sdpa_lse_gpu(causal, hq, hkv, d, monkeypatch):
    """``SDPA_WITH_LSE``: one dense sequence asking for the LSE goes to aten's cuDNN attention
    (GQA included; head dims up to 128, 256 stays on the kernel), output and LSE equal to the
    reference; with cu_seqlens_k covering less than k the kernel after it recomputes both."""
    from mate import mha_interface

    calls = []
    real = mha_interface._sdpa_single_sequence
    monkeypatch.setattr(mha_interface, "_sdpa_single_sequence",
                        lambda *args: calls.append(args[-1] is not None) or real(*args))
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    T = 1000
    q = torch.randn(T, hq, d, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(T + 24, hkv, d, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn_like(k)
    parts = [(0, T)] if causal else [(0, T + 24), (10, T)]  # causal: the path needs k as long as q
    for k0, k1 in parts:
        cu_k = torch.tensor([k0, k1], dtype=torch.int32, device="cuda")
        out = poisoned((T, hq, d), torch.bfloat16, "cuda")
        kk, vv = (k[:T], v[:T]) if causal else (k, v)
        o, lse = flash_attn_varlen_func(q, kk, vv, cu([T], "cuda"), cu_k, T, k1 - k0, causal=causal, out=out,
                                        return_softmax_lse=True)
        ro, rl = attention_varlen_reference(q.cpu(), k[k0:k1].cpu(), v[k0:k1].cpu(), cu([T], "cpu"), [k1 - k0],
                                            causal=causal)
        assert_close(o, ro, atol=2e-2, rtol=2e-2, name=f"out, keys [{k0}, {k1})")
        assert_close(lse, rl, name=f"lse, keys [{k0}, {k1})", **LSE_TOL)
    if d <= 128:
        assert calls and all(calls)
    else:
        assert not calls


@interpreter_only
@pytest.mark.parametrize("causal", [False, True])
def test_single_sequence_path_follows_cu_seqlens(causal, triton_backend, monkeypatch):
    """One request handed to torch's fused attention: the kernel after it leaves the result
    alone when cu_seqlens cover q and k whole, and recomputes the request when they cover
    less (keys k[2:7] of 8 rows), with no host read. The path is CUDA-only; here it is widened
    to the CPU, so the kernel runs under the interpreter."""
    from mate import mha_interface

    monkeypatch.setattr(mha_interface, "_sdpa_device", lambda device: True)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    T, hq, hkv, d = 5, 4, 2, 64
    q = torch.randn(T, hq, d, generator=g).to(torch.bfloat16)
    k = torch.randn(8 if not causal else T, hkv, d, generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    whole = cu([k.shape[0]], "cpu")
    part = torch.tensor([2, 7] if not causal else [1, 4], dtype=torch.int32)
    for cu_k in (whole, part):
        out = poisoned((T, hq, d), torch.bfloat16, "cpu")
        o = flash_attn_varlen_func(q, k, v, cu([T], "cpu"), cu_k, T, k.shape[0], causal=causal, out=out)
        k0, k1 = int(cu_k[0]), int(cu_k[1])
        ro, _ = attention_varlen_reference(q, k[k0:k1], v[k0:k1], cu([T], "cpu"), [k1 - k0], causal=causal)
        assert_close(o, ro, atol=2e-2, rtol=2e-2, name=f"cu_seqlens_k={cu_k.tolist()}")


@interpreter_only
def test_single_sequence_without_keys(triton_backend, monkeypatch):
    """One request with no keys (k of 0 rows) does not go to torch's fused attention, which
    has no defined result for it: out 0, lse -inf, as for any query that sees no key."""
    from mate import mha_interface

    monkeypatch.setattr(mha_interface, "_sdpa_device", lambda device: True)
    calls = []
    monkeypatch.setattr(mha_interface, "_sdpa_single_sequence", lambda *args: calls.append(args))
    q = torch.randn(3, 4, 64).to(torch.bfloat16)
    k = torch.empty(0, 2, 64, dtype=torch.bfloat16)
    cu_k = torch.zeros(2, dtype=torch.int32)
    out = poisoned((3, 4, 64), torch.bfloat16, "cpu")
    o = flash_attn_varlen_func(q, k, k, cu([3], "cpu"), cu_k, 3, 0, out=out)
    assert_equal(o, torch.zeros_like(o))
    assert not calls


def test_paged_bad_pages_are_skipped(device, triton_backend):
    """Pages outside the cache and keys past the table's width are skipped, never read."""
    check_paged_bad_pages(device)


def check_paged_bad_pages(device):
    """The body of :func:`test_paged_bad_pages_are_skipped`."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    lens = [100, 70]
    kc, vc, table = paged_cache(lens, 1, 64, 16, torch.float16, device, g)
    q = torch.randn(2, 1, 4, 64, generator=g).to(torch.float16).to(device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    bad = table.clone()
    bad[0, 2] = 10**6  # keys 32..47 of request 0
    o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=bad)
    keep = [i for i in range(100) if not 32 <= i < 48]
    k0 = kc.cpu()[table[0, :7].cpu().long()].reshape(-1, 1, 64)[keep]
    v0 = vc.cpu()[table[0, :7].cpu().long()].reshape(-1, 1, 64)[keep]
    ro, _ = attention_varlen_reference(q[0].cpu(), k0, v0, cu([1], "cpu"), [len(keep)], k_starts=[0])
    assert_close(o[0], ro, atol=3e-3, rtol=3e-3)
    # the reference skips the same keys (masked in place, so a causal position is kept)
    for causal in (False, True):
        o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=bad, causal=causal)
        rq, _ = attention_varlen_reference(q.reshape(2, 4, 64).cpu(), kc.cpu(), vc.cpu(), cu([1, 1], "cpu"), lens,
                                           page_table=bad.cpu(), causal=causal)
        assert_close(o.reshape(2, 4, 64), rq, atol=3e-3, rtol=3e-3)
    o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table[:, :2].contiguous())
    ro, _ = attention_varlen_reference(q.reshape(2, 4, 64).cpu(), kc.cpu(), vc.cpu(), cu([1, 1], "cpu"), [32, 32],
                                       page_table=table.cpu())
    assert_close(o.reshape(2, 4, 64), ro, atol=3e-3, rtol=3e-3)


_T = torch.zeros(1)
VARLEN_NOT_IMPLEMENTED = {"q_descale": _T, "k_descale": _T, "v_descale": _T, "learnable_sink": _T,
                          "attention_chunk": 64, "seqused_q": _T, "cp_world_size": 2, "cp_rank": 1,
                          "cp_tot_seqused_k": _T}
KVCACHE_NOT_IMPLEMENTED = {"k": _T, "v": _T, "rotary_sin": _T, "cache_batch_idx": _T, "cache_leftpad": _T,
                           "cu_seqlens_k_new": _T, "rotary_seqlens": _T, "q_descale": _T, "learnable_sink": _T,
                           "attention_chunk": 64, "cp_world_size": 2}


@pytest.mark.parametrize("name", sorted(VARLEN_NOT_IMPLEMENTED))
def test_varlen_not_implemented_arguments(name):
    q, k = torch.randn(4, 2, 64, dtype=torch.bfloat16), torch.randn(4, 1, 64, dtype=torch.bfloat16)
    cq = cu([4], "cpu")
    with pytest.raises(NotImplementedError, match=name):
        flash_attn_varlen_func(q, k, k, cq, cq, 4, 4, **{name: VARLEN_NOT_IMPLEMENTED[name]})


@pytest.mark.parametrize("name", sorted(KVCACHE_NOT_IMPLEMENTED))
def test_kvcache_not_implemented_arguments(name):
    q, kc = torch.randn(1, 1, 2, 64, dtype=torch.bfloat16), torch.zeros(1, 16, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=name):
        flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, **{name: KVCACHE_NOT_IMPLEMENTED[name]})


@pytest.mark.parametrize("kw,match", [({"headdim_v": 64}, "headdim_v"), ({"attention_chunk": 64}, "attention_chunk"),
                                      ({"has_softcap": True}, "has_softcap")])
def test_scheduler_metadata_not_implemented_arguments(kw, match):
    with pytest.raises(NotImplementedError, match=match):
        get_scheduler_metadata(2, 1, 256, 8, 2, 128, **kw)


def test_lengths_near_int32_max_end_at_the_tensors(device, triton_backend):
    """Lengths near INT32_MAX (they count as 2**30) over a paged table of 2 pages and a ragged key
    range starting 2**31 - 150 rows before k: the key loops end at the table / k (no wrapped
    int32 counter, no work proportional to the length); the paged rows equal 32-key attention."""
    check_lengths_near_int32_max(device)


def check_lengths_near_int32_max(device):
    """The body of :func:`test_lengths_near_int32_max_end_at_the_tensors`."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    kc, vc = (torch.randn(4, 16, 1, 64, generator=g).to(torch.float16).to(device) for _ in range(2))
    table = torch.tensor([[0, 1], [3, 2]], dtype=torch.int32, device=device)
    q = torch.randn(2, 1, 4, 64, generator=g).to(torch.float16).to(device)
    lens = torch.tensor([2**31 - 1, 2**30 + 5], dtype=torch.int32, device=device)
    o = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, causal=True)
    ro, _ = attention_varlen_reference(q.reshape(2, 4, 64).cpu(), kc.cpu(), vc.cpu(), cu([1, 1], "cpu"), [32, 32],
                                       page_table=table.cpu())
    assert_close(o.reshape(2, 4, 64), ro, atol=3e-3, rtol=3e-3)
    qr = torch.randn(1, 4, 64, generator=g).to(torch.bfloat16).to(device)
    k = torch.randn(128, 1, 64, generator=g).to(torch.bfloat16).to(device)
    ck = torch.tensor([-2**31 + 150, 100], dtype=torch.int32, device=device)
    o, lse = flash_attn_varlen_func(qr, k, k, cu([1], device), ck, 1, 128, return_softmax_lse=True)
    assert (o == 0).all() and torch.isinf(lse).all() and (lse < 0).all()


def test_flags_and_max_seqlen_q_are_checked(device, monkeypatch):
    q = torch.randn(5, 4, 64, device=device).to(torch.bfloat16)
    k = torch.randn(5, 2, 64, device=device).to(torch.bfloat16)
    cq = cu([2, 3], device)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attn_varlen_func(q, k, k, cq, cq, 3, 3, causal="no")
    with pytest.raises(TypeError, match="return_softmax_lse must be a bool"):
        flash_attn_varlen_func(q, k, k, cq, cq, 3, 3, return_softmax_lse="no")
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attn_with_kvcache(q[None], k[None], k[None], causal=1)
    with pytest.raises(ValueError, match=r"max_seqlen_q must be in \[0, 2\*\*31\)"):
        flash_attn_varlen_func(q, k, k, cq, cq, 2**40, 3)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int, got float"):
        flash_attn_varlen_func(q, k, k, cq, cq, 3.0, 3)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int with cu_seqlens_q, got bool"):
        flash_attn_with_kvcache(q, k[None], k[None], cu_seqlens_q=cq, max_seqlen_q=True)
    with pytest.raises(ValueError, match=r"max_seqlen_q must be in \[0, 2\*\*31\)"):
        flash_attn_with_kvcache(q, k[None], k[None], cu_seqlens_q=cq, max_seqlen_q=-1)
    monkeypatch.setenv("MATE_CHECK_INPUTS", "1")
    with pytest.raises(ValueError, match=r"max_seqlen_q must be >= the longest request in cu_seqlens_q \(3\)"):
        flash_attn_varlen_func(q, k, k, cq, cq, 2, 3)


def test_scheduler_dtype_is_checked():
    with pytest.raises(TypeError, match="qkv_dtype must be a torch.dtype, got str"):
        get_scheduler_metadata(1, 1, 1, 4, 1, 64, qkv_dtype="bf16")


def test_prefill_tma_env_overrides():
    from mate.ops.mha import prefill_tma

    assert prefill_tma._env_overrides("enabled=0, block_n=128,stages=2") == {"enabled": False, "block_n": 128,
                                                                             "stages": 2}
    with pytest.raises(ValueError, match="MATE_MHA_PREFILL_TMA: unknown key 'rows'"):
        prefill_tma._env_overrides("rows=64")
