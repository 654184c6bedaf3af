"""The sparse-MLA references against plain float64 loops over the spec, on tiny inputs."""

from __future__ import annotations

import math

import pytest
import torch

from mate.ops.sparse_mla.reference import (
    mla_rope_quantize_fp8_reference,
    sparse_mla_decode_reference,
    sparse_mla_decode_reference_with_magnitude,
)

E4M3_HALF_ULP = 2.0**-4  # e4m3 keeps 3 mantissa bits: rounding error <= 2**-4 relative (normals)
E4M3_SUB_HALF = 2.0**-10  # half of the subnormal spacing 2**-9


def _e4m3_loop_ok(got: torch.Tensor, exact: list[float]) -> None:
    """Each fp8 value equals float64 ``exact`` rounded to e4m3 (saturated), to rounding error.

    The reference rounds fp32 values, the loop float64 ones: both are within half an e4m3
    unit of the exact value (plus fp32's 1e-6 relative), so |got - exact| is bounded by that.
    """
    g = got.float().double().flatten().tolist()
    assert len(g) == len(exact)
    for i, (a, x) in enumerate(zip(g, exact)):
        xs = max(-448.0, min(448.0, x))
        tol = E4M3_HALF_ULP * abs(xs) * (1 + 1e-5) + E4M3_SUB_HALF + 1e-6 * abs(x)
        assert math.isfinite(a), f"element {i}: {a} not finite (exact {x})"
        assert abs(a - xs) <= tol, f"element {i}: {a} vs exact {xs} (tol {tol})"


def _rope_loop(x: list[float], cs: list[float], is_neox: bool) -> list[float]:
    c, s = cs[:32], cs[32:]
    out = [0.0] * 64
    for j in range(32):
        if is_neox:
            a, b, ia, ib = x[j], x[j + 32], j, j + 32
        else:
            a, b, ia, ib = x[2 * j], x[2 * j + 1], 2 * j, 2 * j + 1
        out[ia] = a * c[j] - b * s[j]
        out[ib] = b * c[j] + a * s[j]
    return out


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rope_quant_reference_matches_float64_loop(is_neox, cache_dtype):
    nnz, H, max_seq = 3, 2, 7
    q_rope = (torch.randn(nnz, H, 64) * 3).bfloat16()
    k_rope = (torch.randn(nnz, 64) * 3).bfloat16()
    q_nope = (torch.randn(nnz, H, 512) * 3).bfloat16()
    k_nope = (torch.randn(nnz, 512) * 3).bfloat16()
    q_nope[0, 0, :4] = torch.tensor([1000.0, -1000.0, 500.0, -449.0])  # saturation
    theta = torch.rand(max_seq, 32) * 6.3
    cache = torch.cat([theta.cos(), theta.sin()], dim=1).to(cache_dtype)
    pos = torch.randint(0, max_seq, (nnz,), dtype=torch.int64)
    sq, skv = 1.7, 0.6
    outs = [torch.empty(t.shape, dtype=torch.float8_e4m3fn) for t in (q_rope, k_rope, q_nope, k_nope)]
    mla_rope_quantize_fp8_reference(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox, sq, skv, *outs)
    cache64 = cache.double().tolist()
    exp_qr, exp_kr, exp_qn, exp_kn = [], [], [], []
    for i in range(nnz):
        cs = cache64[int(pos[i])]
        for h in range(H):
            exp_qr += [v * sq for v in _rope_loop(q_rope[i, h].double().tolist(), cs, is_neox)]
            exp_qn += [v * sq for v in q_nope[i, h].double().tolist()]
        exp_kr += [v * skv for v in _rope_loop(k_rope[i].double().tolist(), cs, is_neox)]
        exp_kn += [v * skv for v in k_nope[i].double().tolist()]
    _e4m3_loop_ok(outs[0], exp_qr)
    _e4m3_loop_ok(outs[1], exp_kr)
    _e4m3_loop_ok(outs[2], exp_qn)
    _e4m3_loop_ok(outs[3], exp_kn)
    assert outs[2][0, 0, :4].float().tolist() == [448.0, -448.0, 448.0, -448.0]


def _decode_loop(query, kv_cache, block_tables, seq_lens, s1, s2, abs_values=False):
    B, q_len, H, D = query.shape
    rows = kv_cache.reshape(-1, D).double()
    n_rows = rows.shape[0]
    q64 = query.double()
    out = torch.zeros(B, q_len, H, 512, dtype=torch.float64)
    lse = torch.zeros(B, q_len, H, dtype=torch.float64)
    for b in range(B):
        for t in range(q_len):
            js = [
                j
                for j in range(block_tables.shape[-1])
                if (seq_lens is None or j < int(seq_lens.reshape(-1)[b]))
                and 0 <= int(block_tables[b, t, j]) < n_rows
            ]
            for h in range(H):
                if not js:
                    lse[b, t, h] = math.inf
                    continue
                logits = [s1 * float(q64[b, t, h] @ rows[int(block_tables[b, t, j])]) for j in js]
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                z = sum(w)
                lse[b, t, h] = m + math.log(z)
                acc = torch.zeros(512, dtype=torch.float64)
                for wj, j in zip(w, js):
                    v = rows[int(block_tables[b, t, j]), :512]
                    acc += (wj / z) * (v.abs() if abs_values else v)
                out[b, t, h] = s2 * acc
    return out, lse


@pytest.mark.parametrize("four_d", [False, True])
@pytest.mark.parametrize("with_seq_lens", [True, False])
def test_decode_reference_matches_float64_loop(four_d, with_seq_lens):
    B, q_len, H, topk, pages, page = 3, 2, 3, 8, 3, 4
    n_rows = pages * page
    query = (torch.randn(B, q_len, H, 576) * 2).to(torch.float8_e4m3fn)
    kv = (torch.randn(pages, page, 576) * 2).to(torch.float8_e4m3fn)
    bt = torch.randint(0, n_rows, (B, q_len, topk), dtype=torch.int32)
    bt[0, 0, 1] = -1  # negative: skipped
    bt[0, 1, 2] = n_rows  # out of range: skipped
    bt[1, 0, 3] = bt[1, 0, 0]  # duplicate: counts twice
    bt[2, 1, :] = -1  # no valid slot: out 0, lse +inf
    # rows no valid slot names are NaN: the reference must never let them leak
    used = set(bt[(bt >= 0) & (bt < n_rows)].tolist())
    for r in range(n_rows):
        if r not in used:
            kv.view(-1, 576)[r].view(torch.uint8).fill_(0x7F)
    seq_lens = torch.tensor([topk, 5, 0], dtype=torch.int32) if with_seq_lens else None
    cache = kv.view(pages, 1, page, 576) if four_d else kv
    s1, s2 = 0.05, 1.3
    out, lse = sparse_mla_decode_reference(query, cache, bt, seq_lens, s1, s2)
    ref_out, ref_lse = _decode_loop(query, cache, bt, seq_lens, s1, s2)
    assert out.dtype == torch.bfloat16 and out.shape == (B, q_len, H, 512)
    assert lse.dtype == torch.float32 and lse.shape == (B, q_len, H)
    # out: one bf16 rounding (2**-8 relative) over fp32 math (|v| <= 448, ~1e-6 relative)
    torch.testing.assert_close(out.double(), ref_out, rtol=2.0**-8, atol=1e-3)
    # lse: fp32 logits of magnitude <~ 100, error ~1e-5
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-4)
    assert torch.isinf(lse[2, 1]).all() and (out[2, 1] == 0).all()
    if with_seq_lens:
        assert torch.isinf(lse[2]).all() and (out[2] == 0).all()


def test_decode_value_magnitude_matches_float64_loop():
    """|s2| * softmax @ |v| (the tests' bound on the FP8 P·V's rounding) against the float64
    loop with |v|, fp32 kept; 0 where no slot is valid; at least |reference out|."""
    B, q_len, H, topk, pages, page = 2, 2, 3, 8, 3, 4
    n_rows = pages * page
    query = (torch.randn(B, q_len, H, 576) * 2).to(torch.float8_e4m3fn)
    kv = (torch.randn(pages, page, 576) * 2).to(torch.float8_e4m3fn)
    bt = torch.randint(0, n_rows, (B, q_len, topk), dtype=torch.int32)
    bt[0, 0, 1] = -1
    bt[1, 1, :] = -1  # no valid slot
    seq_lens = torch.tensor([topk, 5], dtype=torch.int32)
    s1, s2 = 0.05, -1.3
    out2, lse2, mag = sparse_mla_decode_reference_with_magnitude(query, kv, bt, seq_lens, s1, s2)
    ref_mag, _ = _decode_loop(query, kv, bt, seq_lens, s1, abs(s2), abs_values=True)
    assert mag.dtype == torch.float32 and mag.shape == (B, q_len, H, 512)
    torch.testing.assert_close(mag.double(), ref_mag, rtol=1e-5, atol=1e-5)
    assert (mag[1, 1] == 0).all()
    out, lse = sparse_mla_decode_reference(query, kv, bt, seq_lens, s1, s2)
    assert bool((mag.double() * (1 + 2.0**-8) + 1e-6 >= out.double().abs()).all())
    # its out and lse are the plain reference's
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_decode_reference_duplicate_counts_twice():
    # two keys, one listed twice: weights 2:1 against a single listing, checked in closed form
    query = torch.zeros(1, 1, 1, 576)
    query[..., 0] = 1.0
    kv = torch.zeros(2, 1, 576)
    kv[0, 0, 0], kv[0, 0, 1] = 1.0, 1.0  # logit 1, value e_1
    kv[1, 0, 0], kv[1, 0, 2] = 2.0, 1.0  # logit 2, value e_2
    bt = torch.tensor([[[0, 0, 1]]], dtype=torch.int32)
    out, lse = sparse_mla_decode_reference(query.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn), bt, None,
                                           1.0, 1.0)
    z = 2 * math.e + math.e**2
    assert abs(lse.item() - math.log(z)) < 1e-5
    assert abs(out[0, 0, 0, 1].item() - 2 * math.e / z) < 2e-3  # bf16
    assert abs(out[0, 0, 0, 2].item() - math.e**2 / z) < 4e-3
