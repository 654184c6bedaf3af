"""Dump and replay of a real public op: ``mla_rope_quantize_fp8`` writing its FP8 outputs
into strided views of merged [nnz, (H,) 576] buffers (nope part ``[..., :512]``, rope
part ``[..., 512:]``), the way DeepSeek-V3.2 serving lays them out."""

from __future__ import annotations

import json
import shutil

import pytest
import torch


def test_dump_keeps_the_merged_buffer_views(mla_rope_dump):
    (call,) = [p for p in (mla_rope_dump / "d").iterdir() if p.is_dir()]
    assert call.name.endswith("_mla_rope_quantize_fp8_call0001")
    meta = json.loads((call / "metadata.json").read_text())
    assert meta["function"] == "mate.sparse_mla_interface:mla_rope_quantize_fp8" and meta["error"] is None
    kwargs = torch.load(call / "inputs.pt")["kwargs"]
    assert kwargs["q_rope_out"].shape == (5, 2, 64) and kwargs["q_rope_out"].stride() == (1152, 576, 1)
    assert kwargs["q_nope_out"].shape == (5, 2, 512) and kwargs["q_nope_out"].stride() == (1152, 576, 1)
    assert kwargs["k_rope_out"].stride() == (576, 1) and kwargs["k_nope_out"].stride() == (576, 1)
    assert kwargs["quant_scale_q"] == 4.0 and kwargs["is_neox"] is False
    q_rope_out, k_rope_out, q_nope_out, k_nope_out = torch.load(call / "outputs.pt")["result"]
    merged = torch.load(mla_rope_dump / "merged.pt")
    assert q_rope_out.stride() == (1152, 576, 1) and k_nope_out.stride() == (576, 1)
    from mate.testing import assert_equal

    assert_equal(q_rope_out, merged["q"][..., 512:])
    assert_equal(q_nope_out, merged["q"][..., :512])
    assert_equal(k_rope_out, merged["k"][:, 512:])
    assert_equal(k_nope_out, merged["k"][:, :512])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_replay(mla_rope_dump, run_mate, backend):
    # the triton replay runs the kernel under the interpreter on CPU and must reproduce the
    # reference's bytes: both round the same fp32 values to e4m3 (ties to even, saturating)
    proc = run_mate("replay", "--dir", str(mla_rope_dump / "d"), MATE_BACKEND=backend, MATE_LOGLEVEL="3",
                    MATE_LOGDEST="stdout", TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK   " in proc.stdout and proc.stdout.rstrip().endswith("1 of 1 call(s) reproduced")
    # the replayed call wrote through the dumped strides
    assert "q_rope_out = Tensor(shape=[5, 2, 64], stride=[1152, 576, 1], dtype=torch.float8_e4m3fn" in proc.stdout
    assert "k_nope_out = Tensor(shape=[5, 512], stride=[576, 1], dtype=torch.float8_e4m3fn" in proc.stdout


def test_replay_fails_on_a_tampered_output(mla_rope_dump, capsys, tmp_path):
    from mate.__main__ import main

    root = tmp_path / "d"
    shutil.copytree(mla_rope_dump / "d", root)
    (call,) = [p for p in root.iterdir() if p.is_dir()]
    res = torch.load(call / "outputs.pt")
    outs = list(res["result"])
    outs[2].view(torch.uint8)[4, 1, 511] ^= 0x02  # one byte of the last nope column of the last token
    torch.save({"result": tuple(outs)}, call / "outputs.pt")
    assert main(["replay", "--dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {call.name} (mate.sparse_mla_interface:mla_rope_quantize_fp8 on cpu)" in out
    assert "result[2]: 1 of 5120 elements differ; first at [[4, 1, 511]]" in out


@pytest.mark.gpu
def test_dump_and_replay_on_the_gpu(run_py, run_mate, tmp_path):
    from .conftest import RUN_MLA_ROPE

    proc = run_py(RUN_MLA_ROPE, MATE_LOGLEVEL="10", MATE_DUMP_DIR=str(tmp_path / "d"), DEMO_DEVICE="cuda",
                  MATE_LOGDEST=str(tmp_path / "log.txt"))
    assert proc.returncode == 0, proc.stderr
    (call,) = [p for p in (tmp_path / "d").iterdir() if p.is_dir()]
    assert json.loads((call / "metadata.json").read_text())["device"].startswith("cuda")
    proc = run_mate("replay", "--dir", str(tmp_path / "d"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(mate.sparse_mla_interface:mla_rope_quantize_fp8 on cuda)" in proc.stdout
    assert proc.stdout.rstrip().endswith("1 of 1 call(s) reproduced")
