"""Input generators for tests and benchmarks (random data, NaN-poisoned outputs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["randn", "rand_fp8", "poisoned", "moe_contiguous_operands", "moe_masked_operands",
           "grouped_contiguous_operands", "paged_chunk_batch"]


def randn(shape: Sequence[int], dtype: torch.dtype = torch.bfloat16, device="cpu", scale: float = 1.0,
          generator: torch.Generator | None = None) -> torch.Tensor:
    return (torch.randn(tuple(shape), device=device, generator=generator) * scale).to(dtype)


def rand_fp8(shape: Sequence[int], device="cpu", scale: float = 1.0,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Random e4m3 values (normal * scale, saturated to +-448)."""
    x = torch.randn(tuple(shape), device=device, generator=generator) * scale
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def poisoned(shape: Sequence[int], dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """An output buffer filled with NaN (or the dtype's largest value for ints), so that
    an element the kernel fails to write is caught by the comparison."""
    t = torch.empty(tuple(shape), dtype=dtype, device=device)
    if dtype.is_floating_point:
        if t.element_size() == 1:
            # the NaN byte of this 8-bit format (0x7F for e4m3fn/e5m2, 0x80 for the fnuz ones)
            nan_byte = torch.full((), float("nan"), dtype=dtype).view(torch.uint8).item()
            t.view(torch.uint8).fill_(nan_byte)
        else:
            t.fill_(float("nan"))
    elif dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(dtype).max)
    return t


def moe_contiguous_operands(groups: int, rows_per_group: int, n: int, k: int, device="cuda"
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Benchmark inputs of the contiguous MoE GEMM: ``rows_per_group`` rows of each of
    ``groups`` experts in order. Returns a [m, k] e4m3, a_scale [m, k/128], b [groups, n, k]
    e4m3, b_scale [groups, n/128, k/128] (scales in [0.001, 0.011)) and the int32 expert of
    each row, m = groups * rows_per_group."""
    m = groups * rows_per_group
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    sa = torch.rand(m, k // 128, device=device) * 0.01 + 0.001
    b = torch.randn(groups, n, k, device=device).to(torch.float8_e4m3fn)
    sb = torch.rand(groups, -(-n // 128), k // 128, device=device) * 0.01 + 0.001
    idx = torch.arange(groups, device=device, dtype=torch.int32).repeat_interleave(rows_per_group)
    return a, sa, b, sb, idx


def moe_masked_operands(groups: int, max_m: int, expected_m: int, n: int, k: int, device="cuda"
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Benchmark inputs of the masked MoE GEMM: a [groups, max_m, k] e4m3, a_scale [groups,
    max_m, k/128], b [groups, n, k] e4m3, b_scale [groups, n/128, k/128] and int32 masked_m,
    each group's count drawn (seeded) from [expected_m / 2, 3 * expected_m / 2] within max_m."""
    a = torch.randn(groups, max_m, k, device=device).to(torch.float8_e4m3fn)
    sa = torch.rand(groups, max_m, k // 128, device=device) * 0.01 + 0.001
    b = torch.randn(groups, n, k, device=device).to(torch.float8_e4m3fn)
    sb = torch.rand(groups, -(-n // 128), k // 128, device=device) * 0.01 + 0.001
    gen = torch.Generator(device="cpu").manual_seed(0)
    counts = torch.randint(max(1, expected_m // 2), min(max_m, expected_m * 3 // 2) + 1, (groups,), generator=gen)
    return a, sa, b, sb, counts.to(torch.int32).to(device)


def grouped_contiguous_operands(rows, n: int, k: int, device="cpu", tail: int = 0, stray: bool = False):
    """Contiguous MoE inputs with padding (tests, sanitizer runs): group g has rows[g] rows padded
    to a multiple of 128 with index -1, then ``tail`` more -1 rows. ``stray``: the padding rows
    get the out-of-range index G + 3 instead (skipped like padding). Returns m_indices [m] int32,
    a [m, k] e4m3, a_scale [m, k/128], b [G, n, k] e4m3 and b_scale [G, ceil(n/128), k/128]
    (scales in [0.005, 0.025))."""
    idx = []
    for g, r in enumerate(rows):
        idx += [g] * r + [len(rows) + 3 if stray else -1] * (-(-r // 128) * 128 - r)
    idx = torch.tensor(idx + [-1] * tail, dtype=torch.int32, device=device)
    m, G = idx.numel(), len(rows)
    a = rand_fp8((m, k), device=device, scale=2.0)
    sa = torch.rand(m, k // 128, device=device) * 0.02 + 0.005
    b = rand_fp8((G, n, k), device=device, scale=2.0)
    sb = torch.rand(G, -(-n // 128), k // 128, device=device) * 0.02 + 0.005
    return idx, a, sa, b, sb


def paged_chunk_batch(q_lens: Sequence[int], ctx: int, hq: int, hkv: int, page: int, head_dim: int = 128,
                      dtype: torch.dtype = torch.bfloat16, device="cuda") -> dict[str, torch.Tensor]:
    """Benchmark inputs of chunked prefill and decode over a paged cache: ``q_lens[i]`` new
    queries of request i at the end of its ``ctx`` keys, each request's ``ctx // page`` pages
    drawn at random from one cache. Returns q [sum(q_lens), hq, D], k_cache / v_cache [pages,
    page, hkv, D], page_table [B, ctx // page] int32, cu_seqlens_q [B + 1] int32 and seqused_k
    [B] int32 (``ctx`` each)."""
    batch, pages = len(q_lens), ctx // page
    k_cache = torch.randn(batch * pages, page, hkv, head_dim, device=device, dtype=dtype)
    offsets = torch.tensor([0, *torch.tensor(list(q_lens)).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "q": torch.randn(sum(q_lens), hq, head_dim, device=device, dtype=dtype),
        "k_cache": k_cache,
        "v_cache": torch.randn_like(k_cache),
        "page_table": torch.randperm(batch * pages, device=device).to(torch.int32).view(batch, pages).contiguous(),
        "cu_seqlens_q": offsets.to(device),
        "seqused_k": torch.full((batch,), ctx, dtype=torch.int32, device=device),
    }
