"""The experimental ``rows`` top-k kernel (four threads per row) against the sort-based
reference: random cases with ties, NaN, +-inf, -0.0, forced blocks, short rows and query
positions, and the rows that take the lanes full-row path (NaN, fewer than W finite groups,
more survivors than slots)."""

from __future__ import annotations

import pytest
import torch
from test_topk import _random_case
from test_topk_lanes import _check_lanes, _mixed_rows


@pytest.mark.parametrize("levels", [None, 2, 3, 40])
def test_rows_random_cases_exact(levels, device, triton_backend):
    s, topk, kw, qpos = _random_case([17, 33, 100, 256], 8, levels, device)
    _check_lanes(s, topk, kw, qpos, method="rows")


@pytest.mark.parametrize("config", ["surv8", "rows8"])
@pytest.mark.parametrize("counted", [True, False])
def test_rows_fallback_and_tie_rows(counted, config, device, triton_backend):
    s = _mixed_rows(7, 256, 37)
    s[6] = -s[6].abs() - 1.0  # zeros of both signs decide the top-k
    s[6, :, 3:250:19] = 0.0
    s[6, :, 5:250:23] = -0.0
    s[6, :, 200:205] = float("inf")
    kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=1, force_blocks_count_in_topk=counted)
    s[0, :, 40:52] = s[0, :, 40:52].abs() + 3.0  # 12 survivors in one thread's 32 blocks: lanes path
    _check_lanes(s.to(device), 16, kw, None, method="rows", rows_config=config)
    qpos = torch.tensor([25000, 3000, 128 * 40, 128 * 17, -1, 2100, 128 * 255], device=device)
    _check_lanes(s.to(device), 8, dict(kw, num_valid_pages=250), qpos, method="rows", rows_config=config, lanes_slack=0)
