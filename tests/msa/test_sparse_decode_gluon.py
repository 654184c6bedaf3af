"""The Gluon fp8 MSA decode candidate (``sparse_decode.DECODE_VARIANT['fp8_kernel'] = "gluon"``):
its sm_90 build on the CPU, and on the GPU against the reference (Gluon has no interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mate.ops.msa import sparse_decode as sd
from mate.ops.msa.reference_attention import sparse_attention_reference
from tests.msa.test_sparse_attention import make_problem, run_case
from tests.msa.test_sparse_decode import _check, _run_padded

FP8 = torch.float8_e4m3fn
SCALES = dict(sm_scale=0.05, k_scale=2.0, v_scale=0.25)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_COMPILE = """
import json, sys
sys.path.insert(0, "benchmarks")
from compile_msa_decode import key_loop_body
from mate.ops.msa import sparse_decode_gluon as sg
from mate.testing.sass import opcode_counts
res = {}
for name, kw in (("m3", {}), ("split_hnd_gp32_flat", dict(splits=3, head_major=True, gp=32, use_page_table=False,
                                                         block_w=32))):
    rep = sg.compile_sm90(**kw)
    ops = opcode_counts(rep.sass)
    count = lambda pre: sum(v for o, v in ops.items() if o.startswith(pre))
    res[name] = dict(regs=rep.registers, shared=rep.shared, spills=rep.spills, warn=rep.ptxas_warnings,
                     u8=count("LDS.U8"), u16=count("LDS.U16"), qgmma=count("QGMMA"), hgmma=count("HGMMA"),
                     loop=key_loop_body(rep.sass, predicated=True))
print(json.dumps(res))
"""


def test_gluon_decode_builds_for_sm90():
    """sm_90 builds (in a child process without the interpreter): at most 128 registers and
    ~55 KB of shared memory for the M3 tile (4 programs per SM), no spills, V read without byte
    gathers, QGMMA and HGMMA; the key loop (two tiles with their rare rescale branches: 970
instructions, 12 CTA barriers, 4 per tile on the common path) against the Triton kernel's
489 / 7 per tile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=600,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for name, r in res.items():
        assert r["spills"] == 0 and not r["warn"], (name, r)
        assert r["u8"] == 0 and r["u16"] == 0 and r["qgmma"] > 0 and r["hgmma"] > 0, (name, r)
    m3 = res["m3"]
    loop = m3.pop("loop")
    assert loop is not None and len(loop) < 1000, m3  # two tiles and their rescale branches
    assert sum(t.startswith("BAR") for t in loop) <= 12, m3
    assert m3["regs"] <= 128 and m3["shared"] + 1024 <= 233472 // 4, m3


@pytest.fixture
def gluon_on(monkeypatch):
    """Routes fp8 decode to the Gluon kernel and counts its launches."""
    from mate.ops.msa import sparse_decode_gluon as sg

    monkeypatch.setitem(sd.DECODE_VARIANT, "kernel", "transposed")
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_kernel", "gluon")
    calls = []
    launch = sg.launch

    def counted(*a, **kw):
        calls.append(kw)
        return launch(*a, **kw)

    monkeypatch.setattr(sg, "launch", counted)
    return calls


def test_gluon_falls_back_off_hopper(monkeypatch):
    """CPU tensors (and the interpreter) never select the Gluon kernel."""
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_kernel", "gluon")
    x = torch.zeros(1, 16, 128).to(FP8)
    assert not sd.use_gluon(True, x, x, x, 16)
    assert not sd.use_gluon(False, x, x, x, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits", [-1, 1, 3])
def test_gluon_decode_gpu_m3(gluon_on, layout, splits):
    """M3 geometry (64 q heads, 4 KV heads, width 16 + 1 forced) at random lengths."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(7)]
    pb = make_problem([1] * 7, kv_lens, hq=64, hkv=4, width=17, dtype=FP8, device="cuda", layout=layout)
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, strided=True, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert gluon_on and gluon_on[-1]["keys"] == 64


@pytest.mark.gpu
@pytest.mark.parametrize("layout,splits,flat,variant", [
    ("NHD", -1, False, {}), ("HND", 3, True, {}), ("NHD", 2, False, {"fp8_lazy": 1}),
    ("HND", 1, False, {"fp8_stages": 2}), ("NHD", 2, True, {"fp8_keys": 128, "fp8_stages": 2})])
def test_gluon_decode_gpu_block_lists(gluon_on, monkeypatch, layout, splits, flat, variant):
    """The program's own block list: one query per request, then requests of several queries
    with padding rows (binary search), flat page lists; lazy threshold 1 (frequent rescales),
    2 stages, 128-key tiles."""
    for key, val in variant.items():
        monkeypatch.setitem(sd.DECODE_VARIANT, key, val)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(7)]
    for q_lens, pad in (([1] * 7, 0), ([1, 3, 0, 2, 1, 1, 4], 5)):
        pb = make_problem(q_lens, kv_lens, hq=64, hkv=4, width=16, dtype=FP8, device="cuda", layout=layout,
                          flat=flat)
        n = sum(q_lens)
        o, l_ = _run_padded("cuda", pb, splits, total_rows=n + pad, **SCALES)
        cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in pb.items()}
        ro, rl = sparse_attention_reference(**cpu, **SCALES)
        _check(o[:n].cpu(), l_[:n].cpu(), ro, rl, FP8)
        assert (o[n:].float() == 0).all() and torch.isinf(l_[n:]).all() and (l_[n:] < 0).all()
    assert len(gluon_on) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("q_lens,kv_lens,qo_offset,ratio,causal,splits", [
    ([2, 0, 1, 3], [300, 50, 129, 700], [100, 0, 128, 690], 16, True, 2),  # qo_offset, binary search
    ([1, 2], [257, 640], None, 4, False, 2),  # not causal, padded head columns
    ([1, 0, 2], [384, 10, 129], None, 32, True, 3)])  # wgmma N = 32
def test_gluon_decode_gpu_offsets_and_groups(gluon_on, q_lens, kv_lens, qo_offset, ratio, causal, splits):
    pb = make_problem(q_lens, kv_lens, hq=2 * ratio, hkv=2, width=8, dtype=FP8, device="cuda", qo_offset=qo_offset)
    o, l_, ro, rl = run_case("cuda", pb, decode=True, causal=causal, splits=splits, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert gluon_on


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2])
def test_gluon_decode_gpu_empty_and_invalid_selections(gluon_on, splits):
    pb = make_problem([1, 1, 1], [384, 384, 200], hq=16, hkv=1, width=4, dtype=FP8, device="cuda")
    idx = pb["kv_block_indexes"]
    idx.fill_(-1)  # token 0: nothing selected
    idx[1, 0] = torch.tensor([9, -1, 3, 7])  # token 1: only out-of-range ids
    idx[2, 0, 2] = 1  # token 2: one block, partly causal
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, **SCALES)
    _check(o, l_, ro, rl, FP8)
    assert (o[:2].float() == 0).all() and torch.isinf(l_[:2]).all() and (l_[:2] < 0).all()
    assert torch.isfinite(l_[2]).all()
    assert gluon_on


@pytest.mark.gpu
@pytest.mark.parametrize("sm_scale", [2.0, 50.0])
def test_gluon_decode_gpu_huge_logits(gluon_on, sm_scale):
    """Logits of tens to ~10^3 (log2 units) spread over the keys: the reference max rises by far
    more than LAZY in later tiles (rescale path), P never overflows."""
    pb = make_problem([1, 1], [2000, 1500], hq=16, hkv=1, width=16, dtype=FP8, device="cuda", adversarial=False)
    o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=1, sm_scale=sm_scale, k_scale=1.0, v_scale=1.0)
    assert torch.isfinite(o.float()).all()
    _check(o, l_, ro, rl, FP8)
    assert gluon_on
