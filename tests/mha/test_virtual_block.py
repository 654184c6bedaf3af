"""``prefill_tma.virtual_block``: the grid axis over a ragged batch's query blocks that both mha
kernels use, against a Python model of the blocks each request needs."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from mate.ops.mha.prefill_tma import virtual_block, virtual_grid_blocks


@triton.jit
def _map_blocks(cu_q_ptr, out_ptr, batch, q_rows, q_len_min, q_len_max, n_mblk, TOKENS: tl.constexpr,
                BLOCK_B: tl.constexpr):
    vblk = tl.program_id(0)
    req, mblk, q_start, q_len = virtual_block(cu_q_ptr, vblk, batch, q_rows, q_len_min, q_len_max, n_mblk, TOKENS,
                                              BLOCK_B)
    tl.store(out_ptr + vblk * 4 + 0, req)
    tl.store(out_ptr + vblk * 4 + 1, mblk)
    tl.store(out_ptr + vblk * 4 + 2, q_start)
    tl.store(out_ptr + vblk * 4 + 3, q_len)


def needed_blocks(cu, q_rows, q_len_min, q_len_max, n_mblk, tokens):
    """(request, block) pairs a kernel must run: the blocks of each request in the class with a
    row inside q, below n_mblk."""
    out = set()
    for r in range(len(cu) - 1):
        n = cu[r + 1] - cu[r]
        if n <= 0 or not q_len_min <= n <= q_len_max:
            continue
        for j in range(min(n_mblk, -(-n // tokens))):
            lo, hi = cu[r] + j * tokens, min(cu[r] + (j + 1) * tokens, cu[r + 1])
            if hi > 0 and lo < q_rows:
                out.add((r, j))
    return out


def run_map(cu, q_rows, q_len_min, q_len_max, n_mblk, tokens, n_virtual):
    """The kernel's map on the GPU when present, else on the CPU under the interpreter (which
    the root conftest turns on where no GPU is present)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = len(cu) - 1
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    out = torch.full((n_virtual, 4), -7, dtype=torch.int32, device=device)
    _map_blocks[(n_virtual,)](cu_t, out, batch, q_rows, q_len_min, q_len_max, n_mblk, TOKENS=tokens,
                              BLOCK_B=max(16, triton.next_power_of_2(batch + 1)))
    return out.tolist()


@pytest.mark.parametrize("case", ["mixed", "decode rows only", "rows outside q", "tight", "class window", "random"])
def test_virtual_block_covers_each_block_once(case):
    """Nondecreasing offsets (rows before and past q included): every block a request needs gets
    exactly one program inside ``virtual_grid_blocks``'s bound, with its request's first row and
    query count; nothing else gets a request."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    tokens, q_len_min, q_len_max, n_mblk = 16, 16, 2**31 - 1, 8
    if case == "mixed":
        lens = [1, 1, 100, 1, 17, 15, 0, 128, 1]
    elif case == "decode rows only":
        lens = [1] * 20
    elif case in ("rows outside q", "tight"):
        lens = [40, 3, 60, 50] if case == "rows outside q" else [17] * 5
    elif case == "class window":  # the packed-heads kernel's longer class: 5..63 queries
        lens, q_len_min, q_len_max = [1, 5, 63, 64, 4, 30, 200], 5, 63
    else:
        lens = torch.randint(0, 90, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist()
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    q_rows = cu[-1]
    if case == "rows outside q":  # the batch starts 37 rows before q and ends 20 rows past it
        cu = [c - 37 for c in cu]
        q_rows = cu[-1] - 20
    if case == "tight":  # requests of two blocks, the first and last straddling q's ends: 9 of the bound's 10
        cu = [c - 15 for c in cu]
        q_rows = cu[-1] - 15
    n_virtual = virtual_grid_blocks(q_rows, len(lens), tokens, q_len_min)
    got = run_map(cu, q_rows, q_len_min, q_len_max, n_mblk, tokens, n_virtual + 3)
    need = needed_blocks(cu, q_rows, q_len_min, q_len_max, n_mblk, tokens)
    seen = []
    for v, (req, mblk, q_start, q_len) in enumerate(got):
        if req < 0:
            continue
        assert v < n_virtual, f"block {v} past the bound {n_virtual}"
        assert (q_start, q_len) == (cu[req], cu[req + 1] - cu[req])
        seen.append((req, mblk))
    assert len(seen) == len(set(seen))
    assert need <= set(seen), f"missing {sorted(need - set(seen))}"
    for req, mblk in set(seen) - need:  # extra programs only for blocks wholly outside q
        lo = cu[req] + mblk * tokens
        assert lo >= q_rows or lo + tokens <= 0 or mblk >= n_mblk, (req, mblk)


def test_virtual_block_adversarial_offsets():
    """Decreasing offsets and values near INT32 limits: every request returned is in the batch
    with its own offsets, each (request, block) at most once, inside its query count."""
    cu = [0, 50, 20, 2**31 - 10, -2**31 + 5, 70, 70, 300]
    got = run_map(cu, 120, 1, 2**31 - 1, 1 << 20, 16, 64)
    seen = set()
    for req, mblk, q_start, q_len in got:
        if req < 0:
            continue
        assert 0 <= req < len(cu) - 1 and (q_start, q_len) == (cu[req], cu[req + 1] - cu[req])
        assert mblk >= 0 and mblk * 16 < q_len and (req, mblk) not in seen
        seen.add((req, mblk))


def test_use_virtual_grid_rule(monkeypatch):
    """The one axis only for ragged batches whose per-request axes are ``virtual_grid`` times
    longer, at most VIRTUAL_MAX_BATCH - 1 requests, within the grid axis's limit; 0 turns it off."""
    from mate.ops.mha import prefill_tma
    from mate.ops.mha.prefill_tma import use_virtual_grid

    cu = torch.zeros(3, dtype=torch.int32)
    monkeypatch.setitem(prefill_tma.PREFILL_TMA, "virtual_grid", 8)
    assert use_virtual_grid(cu, 128, 32, 70)  # 127 decode rows + a 2048-query chunk: 4096 >= 560
    assert not use_virtual_grid(cu, 8, 110, 263)  # ragged lengths 100-7000: 880 < 2104
    assert not use_virtual_grid(None, 128, 32, 70)
    assert not use_virtual_grid(cu, prefill_tma.VIRTUAL_MAX_BATCH, 32, 70)
    assert not use_virtual_grid(cu, 1000, 2000, 70000, axis_limit=65535)
    monkeypatch.setitem(prefill_tma.PREFILL_TMA, "virtual_grid", 0)
    assert not use_virtual_grid(cu, 128, 32, 70)
