"""The Gluon fp8 MSA decode kernel (``sparse_decode.DECODE_VARIANT['fp8_gluon']``): its sm_90
compile on the CPU, and on the GPU against the reference (Gluon has no interpreter)."""

from __future__ import annotations

import pytest
import torch

from mate.ops.msa import sparse_decode as sd
from tests.msa.test_sparse_attention import make_problem, run_case
from tests.msa.test_sparse_decode import _check

FP8 = torch.float8_e4m3fn
SCALES = dict(sm_scale=0.05, k_scale=2.0, v_scale=0.25)


_COMPILE = """
import json
from mate.ops.msa import sparse_decode_gluon as sg
from mate.testing.sass import opcode_counts
res = {}
for ws, overlap in ((False, False), (True, False), (False, True)):
    rep = sg.compile_sm90(64, 3, ws=ws, overlap=overlap)
    ops = opcode_counts(rep.sass)
    count = lambda pre: sum(v for o, v in ops.items() if o.startswith(pre))
    res[f"{int(ws)}{int(overlap)}"] = [rep.registers, rep.kernel.metadata.num_warps, rep.shared, rep.spills,
                                       rep.ptxas_warnings, ops["LDS.U8"], count("LDS.U16"), count("QGMMA"),
                                       count("HGMMA")]
print(json.dumps(res))
"""


def test_gluon_decode_compiles_for_sm90_without_byte_gathers():
    """sm_90 compiles of the three schedules (in a child process without the interpreter, which
    would otherwise have replaced Triton's reduction helpers): the compile table's registers,
    warps and shared memory, no spills, V read without byte gathers, QGMMA and HGMMA."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-2000:]
    for key, (regs, warps, shared, spills, warns, u8, u16, qgmma, hgmma) in json.loads(out.stdout).items():
        ws, overlap = bool(int(key[0])), bool(int(key[1]))
        assert (regs, warps, shared) == sd.GLUON_COMPILES[(64, 3, ws, overlap)]
        assert spills == 0 and not warns
        # (with ``ws`` one LDS.U8 reads Triton's warp-specialization state, not V)
        assert u8 == int(ws) and u16 == 0 and qgmma > 0 and hgmma > 0


@pytest.fixture
def gluon_on(monkeypatch):
    """Routes fp8 decode to the Gluon kernel and counts its launches."""
    from mate.ops.msa import sparse_decode_gluon as sg

    monkeypatch.setitem(sd.DECODE_VARIANT, "kernel", "transposed")
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_gluon", True)
    calls = []
    launch = sg.msa_decode_gluon

    def counted(*a, **kw):
        calls.append(a[-5:])
        return launch(*a, **kw)

    monkeypatch.setattr(sg, "msa_decode_gluon", counted)
    return calls


# every configuration of the compile table, each layout and split mode at least once
M3_CASES = [(64, 3, False, False, "NHD", 1), (64, 3, False, False, "HND", 3), (64, 2, False, False, "NHD", 3),
            (64, 4, False, False, "HND", 1), (128, 2, False, False, "NHD", 1), (128, 2, False, False, "HND", 3),
            (64, 3, True, False, "NHD", 1), (64, 4, True, False, "HND", 3), (64, 3, False, True, "NHD", 1),
            (64, 2, False, True, "HND", 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("keys,stages,ws,overlap,layout,splits", M3_CASES)
def test_gluon_decode_matches_reference(gluon_on, monkeypatch, keys, stages, ws, overlap, layout, splits):
    for name, val in (("keys", keys), ("stages", stages), ("ws", ws), ("overlap", overlap)):
        monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_gluon_" + name, val)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b = 7
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(b)]
    pb = make_problem([1] * b, kv_lens, hq=64, hkv=4, width=17, dtype=FP8, device="cuda", layout=layout)
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, strided=True, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert gluon_on and gluon_on[-1] == (keys, stages, 16, ws, overlap)


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,layout,splits", [(4, "NHD", 2), (8, "HND", -1), (32, "NHD", 1), (16, "HND", 2)])
def test_gluon_decode_group_sizes(gluon_on, ratio, layout, splits):
    """Padded head columns (ratio < 16), wider groups (wgmma N = 32), the automatic split."""
    pb = make_problem([1, 0, 2, 1], [300, 50, 129, 4000], hq=2 * ratio, hkv=2, width=8, dtype=FP8, device="cuda",
                      layout=layout, flat=layout == "HND")
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert gluon_on


@pytest.mark.gpu
@pytest.mark.parametrize("splits,ws,overlap", [(1, False, False), (2, False, False), (1, False, True),
                                               (2, False, True), (2, True, False)])
def test_gluon_decode_empty_and_invalid_selections(gluon_on, monkeypatch, splits, ws, overlap):
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_gluon_ws", ws)
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_gluon_overlap", overlap)
    pb = make_problem([1, 1, 1], [384, 384, 200], hq=16, hkv=1, width=4, dtype=FP8, device="cuda")
    idx = pb["kv_block_indexes"]
    idx.fill_(-1)  # token 0: nothing selected
    idx[1, 0] = torch.tensor([9, -1, 3, 7])  # token 1: only out-of-range ids
    idx[2, 0, 2] = 1  # token 2: one block, partly causal
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert (o[:2].float() == 0).all() and torch.isinf(l_[:2]).all() and (l_[:2] < 0).all()
    assert gluon_on


@pytest.mark.gpu
def test_gluon_decode_falls_back_for_strided_caches(gluon_on):
    pb = make_problem([1, 1], [300, 129], hq=16, hkv=1, width=4, dtype=FP8, device="cuda")
    for name in ("k", "v"):
        big = torch.zeros((2 * pb[name].shape[0], *pb[name].shape[1:]), dtype=FP8, device="cuda")
        big[::2] = pb[name]
        pb[name] = big[::2]
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=1, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert not gluon_on
