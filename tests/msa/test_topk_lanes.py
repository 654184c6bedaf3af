"""The ``lanes`` top-k kernels (survivors of a lane-max bound compacted into lanes): the
``fast`` kernel (the default) and the ``classic`` one, against the sort-based reference:
ties, NaN, +-inf, -0.0, forced blocks, short rows, query positions, row lengths that are not
powers of two, and rows with more than 32 survivors (the full-row fallback)."""

from __future__ import annotations

import random

import pytest
import torch
from test_topk import _random_case, random_config, random_scores

from mate.ops.msa.reference_select import topk_select_reference
from mate.ops.msa.topk import sparse_topk_select_triton
from mate.testing import assert_equal, poisoned
from tests._sm90 import sm90_build_reports


def _check_lanes(s, topk, kw, qpos, **extra):
    """A ``lanes`` kernel (``extra``: ``lanes_kernel``, ``lanes_slack``, ...) against the
    reference."""
    T = s.shape[2]
    args = dict(query_positions=qpos, topk=topk, num_valid_pages=kw["num_valid_pages"] or T,
                force_begin_blocks=kw["force_begin_blocks"], force_end_blocks=kw["force_end_blocks"],
                force_blocks_count_in_topk=kw["force_blocks_count_in_topk"])
    ref = topk_select_reference(s, **args)
    out = poisoned(ref.shape, torch.int32, s.device)
    sparse_topk_select_triton(s, out, **args, method="lanes", **extra)
    assert_equal(out, ref)


def _check_fast(s, topk, kw, qpos, **extra):
    """The ``fast`` lanes kernel (fp32 compares, unmasked full rows, NaN rows on the
    fallback) against the reference."""
    _check_lanes(s, topk, kw, qpos, lanes_kernel="fast", **extra)


def _mixed_rows(rows, T, nan_step):
    """Scores [rows, 2, T] for the fallback and tie tests: random rows, then rows 1-5 with
    more than 32 survivors of the bound (two levels), all equal, all -inf, ties straddling
    the K-th place among fewer than 32 survivors, and a NaN every ``nan_step`` keys."""
    g = torch.Generator().manual_seed(random.randrange(2**31))
    s = torch.randn(rows, 2, T, generator=g)
    s[1] = torch.randint(0, 2, (2, T), generator=g).float()  # > 32 survivors: fallback
    s[2] = 0.0
    s[3] = float("-inf")
    s[4] = -s[4].abs()  # ties straddling the K-th place among fewer than 32 survivors
    s[4, :, 0:100:10] = 4.0
    s[4, :, 105:200:12] = 1.5
    s[5, :, ::nan_step] = float("nan")
    return s


@pytest.mark.parametrize("levels", [None, 2, 3, 40])
def test_lanes_classic_random_cases_exact(levels, device, triton_backend):
    s, topk, kw, qpos = _random_case([33, 64, 100, 256], 8, levels, device)
    _check_lanes(s, topk, kw, qpos, lanes_kernel="classic")


@pytest.mark.parametrize("counted", [True, False])
def test_lanes_classic_fallback_and_tie_rows(counted, device, triton_backend):
    """One launch mixing rows with few survivors (random), ties at the K-th place, and
    rows where more than 32 keys survive the bound (two levels, all equal, all -inf)."""
    s = _mixed_rows(6, 200, 3)
    kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=1, force_blocks_count_in_topk=counted)
    _check_lanes(s.to(device), 16, kw, None, lanes_kernel="classic")
    qpos = torch.tensor([25000, 3000, 128 * 40, 128 * 17, -1, 2100], device=device)
    _check_lanes(s.to(device), 8, dict(kw, num_valid_pages=150), qpos, lanes_kernel="classic")


@pytest.mark.parametrize("levels", [None, 3])
def test_lanes_classic_slack0_and_lane_sum_ballots(levels, device, triton_backend):
    """The bound search run to the end (slack 0: fewer survivors than the default slack 2)
    and ballots from lane sums give the same exact result."""
    s, topk, kw, qpos = _random_case([40, 256], 8, levels, device)
    _check_lanes(s, topk, kw, qpos, lanes_kernel="classic", lanes_slack=0, lanes_vote=False)


@pytest.mark.parametrize("levels", [None, 3, 40])
def test_lanes_fast_random_cases_exact(levels, device, triton_backend):
    s, topk, kw, qpos = _random_case([33, 64, 256], 8, levels, device)
    _check_fast(s, topk, kw, qpos)


@pytest.mark.parametrize("counted", [True, False])
def test_lanes_fast_fallback_and_tie_rows(counted, device, triton_backend):
    """Full rows (unmasked loads), rows with NaN, more than 32 survivors, ties at the K-th
    place, -0.0 against +0.0 at the threshold, and short rows by query positions."""
    s = _mixed_rows(7, 256, 37)
    s[6] = -s[6].abs() - 1.0  # zeros of both signs decide the top-k
    s[6, :, 3:250:19] = 0.0
    s[6, :, 5:250:23] = -0.0
    s[6, :, 200:205] = float("inf")
    kw = dict(num_valid_pages=None, force_begin_blocks=1, force_end_blocks=1, force_blocks_count_in_topk=counted)
    _check_fast(s.to(device), 16, kw, None)
    qpos = torch.tensor([25000, 3000, 128 * 40, 128 * 17, -1, 2100, 128 * 255], device=device)
    _check_fast(s.to(device), 8, dict(kw, num_valid_pages=250), qpos, lanes_slack=0)


def test_lanes_warps_cpu_path_and_bad_argument(device, triton_backend):
    """``lanes_warps`` > 1 (Gluon, GPU only) runs the one-row fast kernel under the
    interpreter: same exact result; other warp counts are refused."""
    s, topk, kw, qpos = _random_case([100, 256], 8, 3, device)
    _check_fast(s, topk, kw, qpos, lanes_warps=4)
    with pytest.raises(ValueError, match="lanes_warps"):
        _check_fast(s, topk, kw, qpos, lanes_warps=3)


_SM90_BUILD = """
import json, re, sys
from triton.experimental.gluon._runtime import GluonASTSource
from mate.ops.msa.topk import LANES_MAXNREG
from mate.ops.msa.topk_warps import _topk_lanes_warps_kernel
from mate.testing.sass import compile_sm90, divisibility_attrs
nw, nreg = (int(a) for a in sys.argv[1:3])
sig = {"s_ptr": "*fp32", "out_ptr": "*i32", "qpos_ptr": "*i64", "n_rows": "i32", "num_tiles": "i32",
       "num_valid_pages": "i32", "H": "i32", "fb": "i32", "fe": "i32", "W": "i32"}
constexprs = {"R": 8, "NW": nw, "HAS_QPOS": True, "FULL": True}
sig.update({c: "constexpr" for c in constexprs})
rep = compile_sm90(GluonASTSource(fn=_topk_lanes_warps_kernel, signature=sig, constexprs=constexprs,
                                  attrs=divisibility_attrs(sig, ["s_ptr", "out_ptr", "qpos_ptr"])),
                   {"num_warps": nw, "maxnreg": nreg or LANES_MAXNREG})
print(json.dumps(dict(shared=rep.shared, local=rep.local, sync=len(re.findall(r"\\b(BAR|LDS|STS|MEMBAR)\\b", rep.sass)),
                      votes=len(re.findall(r"\\bVOTE\\.ANY\\b", rep.sass)),
                      div=len(re.findall(r"\\bBRA\\.DIV\\b", rep.sass)))))
"""


def test_lanes_warps_sm90_build_has_no_shared_memory_or_barrier():
    """The 4-warp program compiles for sm_90 on the CPU (a child process without the
    interpreter), at the default register cap, with warps that never talk: no shared
    memory, no barrier, no local memory, and the ballots of the row; masking whole rows by
    value keeps every branch warp-uniform (no divergence checks before the warp reductions)."""
    rep = sm90_build_reports(_SM90_BUILD, "4", "0", timeout=300)[-1]
    assert rep["shared"] == 0 and rep["local"] == 0 and rep["sync"] == 0, rep
    assert rep["votes"] >= 8 and rep["div"] == 0, rep


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [dict(lanes_kernel="classic"), dict(lanes_kernel="fast", lanes_warps=1),
                                     dict(lanes_kernel="fast", lanes_warps=2), dict(lanes_kernel="fast"),
                                     dict(lanes_kernel="fast", lanes_warps=8)],
                         ids=["classic", "fast", "warps2", "default", "warps8"])
def test_gpu_lanes_thousand_random_cases_with_ties(variant, random_seed):
    rng = random.Random(random_seed)
    gen = torch.Generator().manual_seed(random_seed)
    for i in range(1000):
        T = rng.choice([7, 17, 40, 100, 256, 256, 300])
        tq, H = rng.randint(1, 64), rng.randint(1, 4)
        s = random_scores(tq, H, T, levels=rng.choice([2, 3, 8, 64, None]), specials=i % 2 == 0, gen=gen,
                          device="cuda")
        topk, kw = random_config(rng, T)
        qpos = torch.randint(-300, T * 128 + 50, (tq,), generator=gen).cuda() if rng.random() < 0.4 else None
        _check_lanes(s, topk, kw, qpos, **variant)

