"""The ``mate`` command line (``python -m mate``): check, show-config, env, list-dumps,
replay and bench. The entry points users type run in subprocesses; the variations run
``mate.__main__.main`` in this process."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from mate.__main__ import main
from mate._core.env import ENV_VARS

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@pytest.fixture
def demo_importable(monkeypatch):
    """Makes the dumped functions (``_demo_ops``) importable by an in-process replay."""
    monkeypatch.syspath_prepend(str(HERE))


def _call_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def test_check(run_mate):
    proc = run_mate("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for key in ("python  ", "torch   ", "triton  ", "mate    ", "wrapper "):
        assert re.search(rf"^{key}\S", out, re.M), (key, out)
    if torch.cuda.is_available():
        assert "compile + run of a tiny Triton kernel: ok" in out
    else:
        assert "gpu     none: no CUDA GPU is visible. This is a CPU-only machine" in out
        assert "kernel  interpreter run of a tiny Triton kernel: ok" in out


def test_show_config_json(run_mate, tmp_path):
    proc = run_mate("show-config", "--json", MATE_BACKEND="reference", MATE_DUMP_DIR="my_dumps")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    assert set(cfg) == {
        "mate", "python", "torch", "cuda", "triton", "flashinfer_wrapper", "gpus", "backend_requested",
        "backend_auto_picks", "triton_interpreter", "triton_cache_dir", "dump_dir", "env",
    }
    import mate

    assert cfg["mate"] == mate.__version__ and cfg["torch"] == torch.__version__
    assert cfg["backend_requested"] == "reference" and cfg["backend_auto_picks"] == "reference"
    assert cfg["dump_dir"] == str((tmp_path / "my_dumps").resolve())
    assert set(cfg["env"]) == set(ENV_VARS)
    assert cfg["env"]["MATE_BACKEND"] == "reference" and cfg["env"]["MATE_LOGLEVEL"] == "0"
    assert isinstance(cfg["gpus"], list) and len(cfg["gpus"]) == torch.cuda.device_count()


def test_show_config_text_and_bad_backend(capsys, monkeypatch):
    monkeypatch.setenv("MATE_BACKEND", "auto")
    assert main(["show-config"]) == 0
    out = capsys.readouterr().out
    picks = "triton (CUDA tensors)" if torch.cuda.is_available() else "reference (CPU tensors)"
    assert f"backend_auto_picks: {picks}" in out
    assert "env:\n  MATE_BACKEND=auto\n" in out
    monkeypatch.setenv("MATE_BACKEND", "gpu")
    assert main(["show-config", "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["backend_requested"] == "gpu"
    assert cfg["backend_auto_picks"].startswith("none: MATE_BACKEND must be one of")


def test_env_lists_every_variable(capsys, monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MATE_DUMP_MAX_COUNT", "7")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for name, (default, meaning) in ENV_VARS.items():
        shown = "7 (set)" if name == "MATE_DUMP_MAX_COUNT" else f"{default} (default)"
        assert f"{name}={shown}\n    {meaning}\n" in out
    assert "TRITON_INTERPRET=" in out


def test_env_warns_about_unknown_mate_variables(capsys, monkeypatch):
    monkeypatch.setenv("MATE_LOG_LEVEL", "3")  # a typo of MATE_LOGLEVEL
    assert main(["env"]) == 0
    assert "MATE_LOG_LEVEL=3 (set)\n    warning: not a variable mate reads (a typo?)\n" in capsys.readouterr().out


def test_env_vars_cover_the_code():
    # every MATE_* variable the package and its benchmark scripts read is listed (and so shown by `mate env`)
    used = set()
    for path in [*(REPO / "mate").rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]:
        used |= set(re.findall(r"[\"'](MATE_[A-Z0-9_]+)[\"']", path.read_text()))
    assert used, "no MATE_* variable found: the scan is broken"
    assert used <= set(ENV_VARS), used - set(ENV_VARS)


def test_list_dumps(demo_dump, capsys, monkeypatch, tmp_path):
    root = demo_dump["root"]
    assert main(["list-dumps", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"4 call(s) in {root}"
    names = [d.name for d in _call_dirs(root)]
    assert [line.split()[0] for line in lines[:-1]] == names
    assert all(" _demo_ops:" in line and "  cpu  " in line for line in lines[:-1])
    assert "error: TypeError: x must be one of" in lines[3] and "error" not in lines[0]
    # default root: MATE_DUMP_DIR; a missing root is not an error
    monkeypatch.setenv("MATE_DUMP_DIR", str(tmp_path / "none"))
    assert main(["list-dumps"]) == 0
    assert capsys.readouterr().out.strip() == f"no dumps: {tmp_path / 'none'} does not exist"


def test_replay_reproduces_through_the_strides(demo_dump, run_mate):
    # logging on during the replay shows the strides the replayed calls received
    proc = run_mate("replay", "--dir", str(demo_dump["root"]), MATE_LOGLEVEL="3", MATE_LOGDEST="stdout")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    names = [d.name for d in _call_dirs(demo_dump["root"])]
    for name in names[:3]:
        assert f"OK   {name} (_demo_ops:" in out
    assert f"SAME-ERROR {names[3]}: TypeError: x must be one of" in out
    assert out.rstrip().endswith("4 of 4 call(s) reproduced")
    assert "arg0 = Tensor(shape=[4, 12], stride=[24, 1], dtype=torch.float32" in out
    assert "arg1 = Tensor(shape=[4, 8], stride=[16, 1], dtype=torch.float8_e4m3fn" in out
    assert "arg2 = Tensor(shape=[4, 4], stride=[8, 1], dtype=torch.bfloat16" in out
    assert "arg0 = Tensor(shape=[6, 4], stride=[1, 6], dtype=torch.float32" in out
    assert "out = Tensor(shape=[6, 4], stride=[8, 1], dtype=torch.float32" in out


def test_replay_one_folder_and_no_compare(demo_dump, demo_importable, capsys):
    one = _call_dirs(demo_dump["root"])[1]
    assert main(["replay", "--dir", str(one)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"OK   {one.name} (_demo_ops:split_quantize on cpu)", "1 of 1 call(s) reproduced",
    ]
    assert main(["replay", "--dir", str(one), "--no-compare"]) == 0
    assert capsys.readouterr().out.startswith(f"RAN  {one.name} (_demo_ops:split_quantize on cpu)")


def test_replay_fails_on_tampered_outputs(demo_dump, demo_importable, capsys, tmp_path):
    root = tmp_path / "dumps"
    shutil.copytree(demo_dump["root"], root)
    dirs = _call_dirs(root)
    # call 1: one fp32 element off by 1; call 2: one bit of one fp8 byte of the merged-buffer output
    res = torch.load(dirs[0] / "outputs.pt")
    res["result"][2, 3] += 1.0
    torch.save(res, dirs[0] / "outputs.pt")
    res = torch.load(dirs[1] / "outputs.pt")
    q, r = res["result"]
    q.view(torch.uint8)[1, 5] ^= 0x01
    torch.save({"result": (q, r)}, dirs[1] / "outputs.pt")
    assert main(["replay", "--dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {dirs[0].name} (_demo_ops:scale_rows on cpu)" in out
    assert "result: 1 of 24 elements outside" in out and "first at [[2, 3]]" in out
    assert f"FAIL {dirs[1].name} (_demo_ops:split_quantize on cpu)" in out
    assert "result[0]: 1 of 32 elements differ; first at [[1, 5]]" in out
    assert f"OK   {dirs[2].name}" in out and f"SAME-ERROR {dirs[3].name}" in out
    assert out.rstrip().endswith("2 of 4 call(s) reproduced")


def test_replay_error_mismatches(demo_dump, demo_importable, capsys, tmp_path):
    root = tmp_path / "dumps"
    shutil.copytree(demo_dump["root"], root)
    ok_call, err_call = _call_dirs(root)[0], _call_dirs(root)[3]
    # a call dumped as raising that now returns, and a different error message: both differ
    meta = json.loads((ok_call / "metadata.json").read_text())
    (ok_call / "metadata.json").write_text(json.dumps({**meta, "error": "RuntimeError: boom"}))
    meta = json.loads((err_call / "metadata.json").read_text())
    (err_call / "metadata.json").write_text(json.dumps({**meta, "error": "TypeError: something else"}))
    assert main(["replay", "--dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {ok_call.name}: the dumped call raised RuntimeError: boom; the replay returned" in out
    assert f"FAIL {err_call.name}: raised TypeError: x must be one of" in out
    assert "(the dumped call raised TypeError: something else)" in out
    assert out.rstrip().endswith("2 of 4 call(s) reproduced")


def test_replay_nothing_to_replay(capsys, tmp_path):
    assert main(["replay", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == f"no dumped calls under {tmp_path}"


def test_replay_compares_plain_values():
    from mate.__main__ import _compare

    t = torch.ones(2)
    assert _compare((t, 3, None, "a", {"k": 1.5}), (t.clone(), 3, None, "a", {"k": 1.5}), "r") == []
    assert _compare((t, 4), (t, 3), "r") == ["r[1]: 4 != 3"]
    assert _compare({"k": 1}, {"j": 1}, "r") == ["r: expected a dict with keys ['j']"]
    assert _compare(float("nan"), float("nan"), "r") == []
    assert _compare(1.0, t, "r") == ["r: expected a tensor, got float"]

    @dataclasses.dataclass
    class Plan:
        table: torch.Tensor
        size: int

    assert _compare(Plan(t, 2), Plan(t.clone(), 2), "r") == []
    assert _compare(Plan(t, 2), Plan(t, 3), "r") == ["r.size: 2 != 3"]
    assert _compare(Plan(t + 1, 2), Plan(t, 2), "r")[0].startswith("r.table: 2 of 2 elements outside")


def test_bench_unknown_op(capsys):
    """Only families the runner can run are offered (a module with run(ceilings, quick));
    variant sweeps with their own command lines are not."""
    have = sorted(p.stem.removeprefix("bench_") for p in (REPO / "benchmarks").glob("bench_*.py")
                  if "\ndef run(ceilings" in p.read_text())
    assert "gemm" in have and "gemm_smallm" not in have
    for op in ("no_such_op", "gemm_smallm"):
        assert main(["bench", op]) == 1
        assert capsys.readouterr().out.strip() == f"no benchmark for {op!r}; available: {', '.join(have)}"


def test_show_config_triton_cache_follows_triton_home(run_mate, tmp_path):
    proc = run_mate("show-config", "--json", TRITON_HOME=str(tmp_path / "th"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["triton_cache_dir"] == str(tmp_path / "th" / ".triton" / "cache")


def test_replay_checks_arguments_written_in_place(demo_dump, demo_importable, capsys, tmp_path):
    root = tmp_path / "dumps"
    shutil.copytree(demo_dump["root"], root)
    call = _call_dirs(root)[2]  # scale_rows(x.t(), -1.5, out=out): out written in place
    res = torch.load(call / "outputs.pt")
    res["mutated"]["['kwargs']['out']"][1, 2] += 1.0
    torch.save(res, call / "outputs.pt")
    assert main(["replay", "--dir", str(call)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {call.name}" in out and "['out']: 1 of 24 elements outside" in out


REAL_OPS = """
import torch
from mate.sparse_mla_interface import get_batch_decode_metadata_mla, sparse_mla_fp8_decode
from mate.msa_interface import _msa_plan_from_lengths, msa
q = torch.randn(2, 1, 16, 576).to(torch.float8_e4m3fn)
kv = torch.randn(1, 64, 576).to(torch.float8_e4m3fn)
idx = torch.randint(-1, 64, (2, 1, 64), dtype=torch.int32)
sl = torch.tensor([40, 64], dtype=torch.int32)
md = get_batch_decode_metadata_mla(q, sl, 64)
sparse_mla_fp8_decode(q, kv, None, 128, 512, 64, idx, sl, 4096, sparse_mla_top_k=64, bmm1_scale=0.05, metadata=md)
info = _msa_plan_from_lengths(torch.tensor([3]), torch.tensor([300]), 4, 2, page_size=128, kv_block_num=4,
                              sparse_kernel_mode="prefill")
cache = torch.randn(3, 128, 2, 128).bfloat16()
blocks = torch.tensor([0, 2, -1, -1], dtype=torch.int32).expand(3, 2, 4).contiguous()
msa(torch.randn(3, 4, 128).bfloat16(), cache, cache, info, kv_block_indexes=blocks,
    page_table=torch.tensor([[2, 0, 1]], dtype=torch.int32))
"""


def test_replay_of_ops_taking_plans_and_metadata(run_py, run_mate, tmp_path):
    """Calls whose arguments and results are plans or metadata objects (a named tuple of
    dataclasses, a frozen dataclass with scratch buffers) dump and replay."""
    proc = run_py(REAL_OPS, MATE_LOGLEVEL="10", MATE_DUMP_DIR=str(tmp_path / "dumps"), MATE_LOGDEST="stderr")
    assert proc.returncode == 0 and "logging failed" not in proc.stderr, proc.stderr
    proc = run_mate("replay", "--dir", str(tmp_path / "dumps"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("4 of 4 call(s) reproduced")


@pytest.mark.gpu
def test_check_on_the_gpu(run_mate):
    test_check(run_mate)  # on the H200: compile + run of the tiny kernel, compute capability 9.0
