"""The single-partition Gluon groupwise kernel (``groupwise_gluon_flat.py``, ``FLAT`` configs).

On the CPU: its config checks, the shared-memory formula against sm_90 builds (compiled here
without a GPU) and the fallback to the plain-Triton kernel off Hopper. On a Hopper GPU: the
kernel against the reference, in both scale modes, repeatable, and inside a CUDA graph.
"""

from __future__ import annotations

import json

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.ops.gemm import tuning
from mate.ops.gemm.groupwise import CONTIGUOUS, PLAIN
from mate.testing import assert_close, poisoned
from tests._sm90 import sm90_build_reports
from tests.gemm._inputs import fp8_block_operands, launch_groupwise_plain
from tests.gemm.test_groupwise_gluon import auto_configs


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


FLAT_CONFIGS = {
    "flat 64x16 st4 kps4": {"BLOCK_N": 16, "num_stages": 4, "KPS": 4},
    "flat 64x32 st8 kps2": {"BLOCK_N": 32, "num_stages": 8, "KPS": 2},
    "flat 64x64 st1": {"BLOCK_N": 64, "num_stages": 1},
    "flat 64x128 st2 kps3": {"BLOCK_N": 128, "num_stages": 2, "KPS": 3},
    # two wgmmas of a stage in flight
    "flat 64x64 st4 kps2 e": {"BLOCK_N": 64, "num_stages": 4, "KPS": 2, "EAGER": True},
    "flat 64x32 st3 kps4 e": {"BLOCK_N": 32, "num_stages": 3, "KPS": 4, "EAGER": True},
    "flat 64x128 st2 kps2 e": {"BLOCK_N": 128, "num_stages": 2, "KPS": 2, "EAGER": True},
    # the configs backend="auto" picks (tuning.GROUPWISE_GLUON)
    **auto_configs("flat"),
}


def _flat(a, b, sa, sb, out, cfg, k_major=True):
    launch_groupwise_plain(a, b, sa, sb, out, {"GLUON": True, "GROUP_M": 8, "num_warps": 4, "BLOCK_M": 64,
                                               **cfg, "FLAT": True}, k_major=k_major)


def test_flat_config_falls_back_off_hopper():
    """Off Hopper a FLAT config runs the plain-Triton kernel with its tile."""
    if _hopper():
        pytest.skip("covered by the GPU tests")
    a, b, sa, sb = fp8_block_operands(40, 192, 384)
    out = poisoned((40, 192), torch.bfloat16, "cpu")
    _flat(a, b, sa, sb, out, FLAT_CONFIGS["flat 64x64 st1"])
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)


def test_flat_rejects_bad_configs():
    from mate.ops.gemm.groupwise_gluon import groupwise_gemm_gluon

    a, b, sa, sb = fp8_block_operands(64, 192, 256)
    out = torch.empty(64, 192, dtype=torch.bfloat16)
    bad = [({"BLOCK_N": 256}, "no 64x256 tile"), ({"BLOCK_N": 8}, "no 64x8 tile"),
           ({"BLOCK_N": 64, "KPS": 5}, "KPS"), ({"BLOCK_N": 64, "KPS": 2.0}, "KPS"),
           ({"BLOCK_N": 64, "num_stages": 0}, "num_stages"),
           ({"BLOCK_N": 128, "num_stages": 8, "KPS": 2}, "shared memory")]
    for cfg, msg in bad:
        with pytest.raises(ValueError, match=msg):
            groupwise_gemm_gluon(a, b, sa, (0, sa.stride(0), 1), sb, (0, sb.stride(0), 1), out, layout=PLAIN,
                                 config={"FLAT": True, **cfg})
    with pytest.raises(ValueError, match="PLAIN"):
        groupwise_gemm_gluon(a, b, sa, (0, sa.stride(0), 1), sb, (0, sb.stride(0), 1), out, layout=CONTIGUOUS,
                             config={"FLAT": True, "BLOCK_N": 64})


def test_flat_auto_entries_fit():
    """Every FLAT entry of auto's table passes the launcher's checks at its shape's K."""
    from mate.ops.gemm.groupwise_gluon_flat import check_flat_config

    entries = {key: cfg for key, cfg in tuning.GROUPWISE_GLUON.items() if cfg.get("FLAT")}
    assert entries
    for key, cfg in entries.items():
        assert cfg["BLOCK_M"] == 64, key
        check_flat_config(cfg["BLOCK_N"], cfg["num_stages"], int(key.split(",")[2]), cfg.get("KPS", 1))


_FLAT_SM90_BUILD = """
import json, sys
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from mate.ops.gemm import groupwise_gluon_flat as gf
from mate.ops.gemm.groupwise_gluon import a_box_rows
from mate.testing.sass import compile_sm90, divisibility_attrs

def desc(rows):
    layout = gl.NVMMASharedLayout.get_default_for([rows, 128], gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{rows}, 128],{layout}>"

for cfg, m, k in json.loads(sys.argv[1]):
    bn, kps = cfg["BLOCK_N"], cfg.get("KPS", 1)
    stages = max(1, min(cfg["num_stages"], -(-(k // 128) // kps)))  # as the launcher caps them
    sig = {"a_desc": desc(a_box_rows(m, 64)), "b_desc": desc(bn), "as_ptr": "*fp32", "bs_ptr": "*fp32",
           "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_asm": "i32", "stride_ask": "i32",
           "stride_bsn": "i32", "stride_bsk": "i32", "stride_cm": "i32"}
    cx = {"BLOCK_N": bn, "GROUP_M": 8, "STAGES": stages, "KB_ROWS": gf._kb_rows(k, kps), "KPS": kps,
          "EAGER": cfg.get("EAGER", False) and kps > 1}
    sig.update({c: "constexpr" for c in cx})
    rep = compile_sm90(GluonASTSource(fn=gf.fp8_groupwise_flat_kernel, signature=sig, constexprs=cx,
                                      attrs=divisibility_attrs(sig, ["as_ptr", "bs_ptr", "c_ptr", "K"])),
                       {"num_warps": 4})
    print(json.dumps(dict(cfg=cfg, k=k, shared=rep.shared, est=gf.flat_shared_bytes(bn, stages, k, kps),
                          spills=rep.spills, mma=rep.sass.count("QGMMA"), regs=rep.registers)))
"""


def _flat_builds():
    """(config, M, K) of the sm_90 build test: each GPU-test config at the GPU tests' K = 1152,
    and auto's configs at their table's (M bucket, K)."""
    out = [(cfg, 17, 1152) for cfg in FLAT_CONFIGS.values() if "FLAT" not in cfg]
    for key, cfg in tuning.GROUPWISE_GLUON.items():
        if cfg.get("FLAT"):
            out.append((cfg, int(key.split(",")[0][1:]), int(key.split(",")[2])))
    return out


def test_flat_sm90_build():
    """The kernel compiles for sm_90 on the CPU (a child process without the interpreter): no
    spills, QGMMA, and shared memory exactly ``flat_shared_bytes`` (the launcher's check)."""
    from mate.testing.sass import SMEM_LIMIT

    builds = _flat_builds()
    reps = sm90_build_reports(_FLAT_SM90_BUILD, json.dumps(builds))
    assert len(reps) == len(builds)
    for rep in reps:
        assert rep["spills"] == 0 and rep["mma"] > 0 and rep["shared"] == rep["est"] <= SMEM_LIMIT, rep


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(FLAT_CONFIGS))
@pytest.mark.parametrize("m,n,k", [
    (64, 7168, 2048),  # a measured shape
    (130, 200, 1152),  # partial row and column tiles, 9 K blocks (a zero-scale block with KPS 2 / 4)
    (1, 320, 384),  # 3 K blocks: fewer stages than configured; an 8-row A box
    (17, 200, 1152),  # a 32-row A box (a_box_rows) with 15 rows past M
    (16, 24576, 1536),  # several programs per SM
])
def test_flat_plain(name, m, n, k):
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    cfg = FLAT_CONFIGS[name]
    for k_major in (True, False):  # the scales read in place through their strides
        out = poisoned((m, n), torch.bfloat16, "cuda")
        _flat(a, b, sa, sb, out, cfg, k_major)
        assert_close(out, ref, max_rel_error=1e-2, name=f"{name} K-major={k_major}")
    first = out.clone()
    _flat(a, b, sa, sb, out, cfg, False)
    assert torch.equal(first.view(torch.int16), out.view(torch.int16))  # deterministic


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
def test_auto_flat_in_cuda_graph():
    """auto's single-partition config (16, 7168, 2048): a captured call replayed on new operands
    (copied into the captured tensors) equals the eager call on them, bit for bit."""
    from mate import gemm

    m, n, k = 16, 7168, 2048
    assert tuning.groupwise_config(m, n, k, fp8_out=False)["GLUON"].get("FLAT")
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    out = poisoned((m, n), torch.bfloat16, "cuda")
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="auto")  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="auto")
    for _ in range(3):
        new = fp8_block_operands(m, n, k, "cuda")
        for dst, src in zip((a, b, sa, sb), new):
            dst.copy_(src)
        eager = gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", backend="auto")
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
        assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)
