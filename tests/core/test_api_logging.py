"""API logging (``mate.api_logging.mate_api``): levels, destinations, dumps and their
limits, and failures inside logging. ``MATE_LOGLEVEL`` is read once, at import, so each
configuration runs in its own subprocess (fixtures ``run_py`` and ``demo_dump`` in
``conftest.py``); the functions logged are the public ones of ``_demo_ops``."""

from __future__ import annotations

import json
import re

import torch

from mate.api_logging import restore_tensors, snapshot_tensors
from mate.testing import assert_equal

CALL_DIR = re.compile(r"^(\d{8}_\d{6}_\d{6})_pid(\d+)_([A-Za-z_]\w*?)_call(\d{4})$")


def _mate_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[mate]")]


def _call_dirs(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def test_level0_returns_the_function_itself(run_py, tmp_path):
    proc = run_py(
        """
        import torch, _demo_ops
        from mate.api_logging import CONFIG, mate_api
        def f(x):
            return x
        assert CONFIG.level == 0
        assert mate_api(f) is f
        assert not hasattr(_demo_ops.scale_rows, "__wrapped__")
        y = _demo_ops.scale_rows(torch.ones(2, 3), 2.0)
        assert torch.equal(y, torch.full((2, 3), 2.0))
        print("done")
        """,
        MATE_LOGLEVEL="0", MATE_DUMP_DIR=str(tmp_path / "dumps"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert "[mate]" not in proc.stderr
    assert not (tmp_path / "dumps").exists()


def test_level1_names_to_stdout(run_py):
    proc = run_py(
        """
        import torch, _demo_ops
        x = torch.randn(4, 6)
        _demo_ops.scale_rows(x, 2.0)
        _demo_ops.takes_anything(x)
        """,
        MATE_LOGLEVEL="1", MATE_LOGDEST="stdout",
    )
    assert proc.returncode == 0, proc.stderr
    assert _mate_lines(proc.stdout) == [
        "[mate] call #1 _demo_ops.scale_rows",
        "[mate] call #2 _demo_ops.takes_anything",
    ]
    assert "[mate]" not in proc.stderr


def test_level3_arguments_to_a_file_with_pid(run_py, tmp_path):
    proc = run_py(
        """
        import os, torch, _demo_ops
        x = torch.randn(4, 6)
        out = torch.empty(6, 8)[:, 2:6]
        _demo_ops.scale_rows(x.t(), 2.0, out=out)
        _demo_ops.takes_anything(x[:2], obj={"a": torch.zeros(3, dtype=torch.int32), "b": [1, (2, "z")]})
        _demo_ops.takes_anything(x, "y" * 500)
        print(os.getpid())
        """,
        MATE_LOGLEVEL="3", MATE_LOGDEST=str(tmp_path / "logs" / "mate_%i.log"),
    )
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.strip())
    assert "[mate]" not in proc.stdout + proc.stderr
    log = (tmp_path / "logs" / f"mate_{pid}.log").read_text()
    lines = _mate_lines(log)
    assert lines[:5] == [
        "[mate] call #1 _demo_ops.scale_rows",
        "[mate]   arg0 = Tensor(shape=[6, 4], stride=[1, 6], dtype=torch.float32, device=cpu)",
        "[mate]   arg1 = 2.0",
        "[mate]   out = Tensor(shape=[6, 4], stride=[8, 1], dtype=torch.float32, device=cpu)",
        "[mate]   result = Tensor(shape=[6, 4], stride=[8, 1], dtype=torch.float32, device=cpu)",
    ]
    assert lines[5:9] == [
        "[mate] call #2 _demo_ops.takes_anything",
        "[mate]   arg0 = Tensor(shape=[2, 6], stride=[6, 1], dtype=torch.float32, device=cpu)",
        "[mate]   obj = {a: Tensor(shape=[3], stride=[1], dtype=torch.int32, device=cpu), b: [1, (2, 'z')]}",
        "[mate]   result = Tensor(shape=[2, 6], stride=[6, 1], dtype=torch.float32, device=cpu)",
    ]
    long_arg = lines[11]
    assert long_arg.startswith("[mate]   arg1 = 'yyy") and long_arg.endswith("...")
    assert len(long_arg) < 230  # long reprs are cut at 200 characters
    assert "min=" not in log  # statistics only from level 5


def test_level5_statistics(run_py):
    proc = run_py(
        """
        import torch, _demo_ops
        inf, nan = float("inf"), float("nan")
        x = torch.tensor([[1.0, 2.0, nan, inf], [-inf, -3.0, 0.5, 4.0]])
        _demo_ops.scale_rows(x, 1.0)
        _demo_ops.takes_anything(torch.tensor([1, 5, 3]), obj=torch.tensor([nan, nan]))
        fp8 = torch.tensor([0.5, -448.0, nan]).to(torch.float8_e4m3fn)
        _demo_ops.takes_anything(torch.empty(0, 3), obj=[fp8, torch.tensor([True, False, True])])
        """,
        MATE_LOGLEVEL="5",
    )
    assert proc.returncode == 0, proc.stderr
    lines = _mate_lines(proc.stderr)
    stats = "{min=-3, max=4, mean=0.9, nan=1, inf=2}"
    assert lines[1] == f"[mate]   arg0 = Tensor(shape=[2, 4], stride=[4, 1], dtype=torch.float32, device=cpu) {stats}"
    assert lines[3].endswith(f"device=cpu) {stats}") and lines[3].startswith("[mate]   result = ")
    assert lines[5].endswith("dtype=torch.int64, device=cpu) {min=1, max=5, mean=3}")
    assert lines[6].endswith("device=cpu) {nan=2, inf=0}")
    assert lines[7].endswith("dtype=torch.int64, device=cpu) {min=2, max=6, mean=4}")
    assert lines[9].endswith("device=cpu) {empty}")
    assert "dtype=torch.float8_e4m3fn, device=cpu) {min=-448, max=0.5, mean=-223.75, nan=1, inf=0}" in lines[10]
    assert lines[10].endswith("dtype=torch.bool, device=cpu) {true=2}]")


def test_level10_dump_layout(demo_dump):
    root, pid = demo_dump["root"], demo_dump["pid"]
    dirs = _call_dirs(root)
    assert [CALL_DIR.match(d.name).group(3, 4) for d in dirs] == [
        ("scale_rows", "0001"), ("split_quantize", "0002"), ("scale_rows", "0003"), ("scale_rows", "0004"),
    ]
    for d in dirs:
        assert int(CALL_DIR.match(d.name).group(2)) == pid
        assert sorted(p.name for p in d.iterdir()) == ["inputs.pt", "metadata.json", "outputs.pt"]
    metas = [json.loads((d / "metadata.json").read_text()) for d in dirs]
    assert [m["function"] for m in metas] == [
        "_demo_ops:scale_rows", "_demo_ops:split_quantize", "_demo_ops:scale_rows", "_demo_ops:scale_rows",
    ]
    for m in metas:
        assert m["pid"] == pid and m["device"] == "cpu" and m["torch"] == torch.__version__ and m["bytes"] > 0
    assert [m["error"] for m in metas[:3]] == [None, None, None]
    assert metas[3]["error"] == "TypeError: x must be one of (torch.float32, torch.bfloat16), got torch.int32"
    assert "raised: x must be one of" in demo_dump["stdout"]  # the caller got the error unchanged
    session = [json.loads(line) for line in (root / "session.jsonl").read_text().splitlines()]
    assert [s["dir"] for s in session] == [d.name for d in dirs]
    assert [s["function"] for s in session] == [m["function"] for m in metas]
    # level 10 logs like level 5 too
    assert "[mate] call #1 _demo_ops.scale_rows" in demo_dump["stderr"] and "nan=0, inf=0}" in demo_dump["stderr"]


def test_level10_dump_contents_keep_strides(demo_dump):
    dirs = _call_dirs(demo_dump["root"])
    expected = torch.load(demo_dump["work"] / "expected.pt")
    # call 1: plain input, allocated output
    inp = torch.load(dirs[0] / "inputs.pt")
    assert inp["kwargs"] == {} and inp["args"][1] == 2.0
    assert_equal(inp["args"][0], expected["x"])
    assert_equal(torch.load(dirs[0] / "outputs.pt")["result"], expected["r1"])
    # call 2: strided input and the two views of the merged output buffer, with their strides
    inp = torch.load(dirs[1] / "inputs.pt")
    x, q, r = inp["args"]
    assert inp["kwargs"] == {"scale": 3.0}
    assert x.stride() == (24, 1) and x.shape == (4, 12)
    assert (q.dtype, q.shape, q.stride()) == (torch.float8_e4m3fn, (4, 8), (16, 1))
    assert (r.dtype, r.shape, r.stride()) == (torch.bfloat16, (4, 4), (8, 1))
    assert_equal(x, expected["xs"])
    assert torch.isnan(q.float()).all()  # the inputs are the buffers before the call (poisoned)
    q_out, r_out = torch.load(dirs[1] / "outputs.pt")["result"]
    assert q_out.stride() == (16, 1) and r_out.stride() == (8, 1)
    mutated = torch.load(dirs[1] / "outputs.pt")["mutated"]  # the buffers written in place, by argument path
    assert sorted(mutated) == ["['args'][1]", "['args'][2]"]
    assert_equal(mutated["['args'][1]"], expected["q"])
    assert_equal(q_out, expected["q"])
    assert_equal(r_out, expected["r"])
    # call 3: transposed input, strided out= buffer
    inp = torch.load(dirs[2] / "inputs.pt")
    assert inp["args"][0].stride() == (1, 6) and inp["kwargs"]["out"].stride() == (8, 1)
    res = torch.load(dirs[2] / "outputs.pt")["result"]
    assert res.stride() == (8, 1)
    assert_equal(res, expected["r3"])
    assert sorted(torch.load(dirs[2] / "outputs.pt")["mutated"]) == ["['kwargs']['out']"]
    # call 4 raised: its result is empty
    assert torch.load(dirs[3] / "outputs.pt")["result"] is None


def test_snapshot_and_restore_keep_strides_and_values():
    base = torch.randn(5, 16)
    views = [base[1:4, 3:9], base.t()[2:5], base[:, ::3], base[0:0], base[2, 4], base.expand(2, 5, 16)]
    snap = snapshot_tensors({"v": views, "t": (1, "a")})
    assert snap["t"] == (1, "a")
    for view, s in zip(views, snap["v"]):
        assert s.shape == view.shape and s.stride() == view.stride()
        assert_equal(s, view)
        assert s.untyped_storage().data_ptr() != base.untyped_storage().data_ptr() or view.numel() == 0
        r = restore_tensors(s, torch.device("cpu"))
        assert r.shape == view.shape and r.stride() == view.stride()
        assert_equal(r, view)
    # a snapshot holds only the span the view covers, not the whole base buffer
    assert snap["v"][0].untyped_storage().nbytes() == ((2 * 16 + 5) + 1) * 4


def test_dump_limits(run_py, tmp_path):
    limit_gb = 2000 / 2**30  # 2000 bytes: a 4x6 fp32 call (96 B in, 96 B out) fits, a 1000-float one not
    proc = run_py(
        """
        import torch, _demo_ops
        small, big = torch.randn(4, 6), torch.randn(1000, 1)
        for x in (small, big, small, small, small):
            _demo_ops.scale_rows(x, 2.0)
        """,
        MATE_LOGLEVEL="10", MATE_DUMP_DIR=str(tmp_path / "d"), MATE_DUMP_MAX_COUNT="3",
        MATE_DUMP_MAX_SIZE_GB=repr(limit_gb),
    )
    assert proc.returncode == 0, proc.stderr
    dirs = _call_dirs(tmp_path / "d")
    assert [CALL_DIR.match(d.name).group(4) for d in dirs] == ["0001", "0003", "0004"]
    skipped = [line for line in _mate_lines(proc.stderr) if "skipped" in line]
    assert skipped == ["[mate] dump of _demo_ops.scale_rows skipped: dump limits reached"] * 2
    assert len((tmp_path / "d" / "session.jsonl").read_text().splitlines()) == 3


def test_dump_include_exclude(run_py, tmp_path):
    proc = run_py(
        """
        import torch, _demo_ops
        x = torch.randn(2, 12)
        _demo_ops.takes_anything(x)
        q, r = torch.empty(2, 8, dtype=torch.float8_e4m3fn), torch.empty(2, 4, dtype=torch.bfloat16)
        _demo_ops.split_quantize(x, q, r)
        _demo_ops.scale_rows(x, 1.0)
        """,
        MATE_LOGLEVEL="10", MATE_DUMP_DIR=str(tmp_path / "d"),
        MATE_DUMP_INCLUDE="scale_*, split_*", MATE_DUMP_EXCLUDE="split_*",
    )
    assert proc.returncode == 0, proc.stderr
    assert [CALL_DIR.match(d.name).group(3, 4) for d in _call_dirs(tmp_path / "d")] == [("scale_rows", "0003")]


def test_dump_patterns_match_dotted_names_too(run_py, tmp_path):
    """A pattern may name the module as the log lines do (``_demo_ops.scale_*``) or not."""
    script = """
        import torch, _demo_ops
        x = torch.randn(2, 12)
        _demo_ops.takes_anything(x)
        _demo_ops.scale_rows(x, 1.0)
        """
    for sub, patterns, dumped in (("d", {"MATE_DUMP_INCLUDE": "_demo_ops.scale_*"}, ["scale_rows"]),
                                  ("e", {"MATE_DUMP_EXCLUDE": "_demo_ops.*"}, [])):
        root = tmp_path / sub
        proc = run_py(script, MATE_LOGLEVEL="10", MATE_DUMP_DIR=str(root), **patterns)
        assert proc.returncode == 0, proc.stderr
        names = [CALL_DIR.match(d.name).group(3) for d in _call_dirs(root)] if root.exists() else []
        assert names == dumped, patterns


def test_failures_inside_logging_never_reach_the_caller(run_py, tmp_path):
    proc = run_py(
        """
        import torch, _demo_ops
        x = torch.randn(3, 4)
        y = _demo_ops.takes_anything(x, _demo_ops.Unprintable())
        assert torch.equal(y, x + 1)
        try:
            _demo_ops.scale_rows(x.int(), 1.0)
        except TypeError as exc:
            print("TypeError:", exc)
        print("done")
        """,
        MATE_LOGLEVEL="10", MATE_DUMP_DIR=str(tmp_path / "d"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "TypeError: x must be one of (torch.float32, torch.bfloat16), got torch.int32", "done",
    ]
    assert "[mate] logging failed during argument logging: RuntimeError: repr exploded" in proc.stderr
    assert "[mate] logging failed during output dump: RuntimeError: pickling exploded" in proc.stderr
    # the unpicklable call leaves no half-written folder; the failing call is dumped
    dirs = _call_dirs(tmp_path / "d")
    assert [CALL_DIR.match(d.name).group(3, 4) for d in dirs] == [("scale_rows", "0002")]


def test_unwritable_log_destination(run_py, tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    proc = run_py(
        """
        import torch, _demo_ops
        print(_demo_ops.scale_rows(torch.ones(1, 2), 3.0).tolist())
        """,
        MATE_LOGLEVEL="5", MATE_LOGDEST=str(tmp_path / "afile" / "log_%i.txt"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[[3.0, 3.0]]"


def test_log_config_parsing(monkeypatch):
    from mate.api_logging import LogConfig

    for name in ("MATE_LOGLEVEL", "MATE_LOGDEST", "MATE_DUMP_DIR", "MATE_DUMP_MAX_SIZE_GB", "MATE_DUMP_MAX_COUNT",
                 "MATE_DUMP_INCLUDE", "MATE_DUMP_EXCLUDE"):
        monkeypatch.delenv(name, raising=False)
    assert LogConfig.from_env() == LogConfig(level=0, dest="stderr", dump_dir="mate_dumps", dump_max_size_gb=20.0,
                                             dump_max_count=1000, dump_include=(), dump_exclude=())
    monkeypatch.setenv("MATE_LOGLEVEL", "5")
    monkeypatch.setenv("MATE_DUMP_MAX_COUNT", "7")
    monkeypatch.setenv("MATE_DUMP_MAX_SIZE_GB", "0.5")
    monkeypatch.setenv("MATE_DUMP_INCLUDE", " mla_*, ,*decode ")
    cfg = LogConfig.from_env()
    assert (cfg.level, cfg.dump_max_count, cfg.dump_max_size_gb) == (5, 7, 0.5)
    assert cfg.dump_include == ("mla_*", "*decode") and cfg.dump_exclude == ()
    # unparsable values fall back to the defaults rather than breaking the import of mate
    monkeypatch.setenv("MATE_LOGLEVEL", "verbose")
    monkeypatch.setenv("MATE_DUMP_MAX_COUNT", "many")
    monkeypatch.setenv("MATE_DUMP_MAX_SIZE_GB", "")
    cfg = LogConfig.from_env()
    assert (cfg.level, cfg.dump_max_count, cfg.dump_max_size_gb) == (0, 1000, 20.0)


def test_snapshot_and_restore_plans():
    """Named tuples keep their type; dataclasses (plans, metadata) are copied field by field,
    their scratch fields (compare=False) kept as shape and dtype only and re-allocated, their
    devices set to the restore device; the dump size counts their tensors."""
    from mate.api_logging import _nbytes
    from mate.msa_interface import _msa_plan_from_lengths
    from mate.ops.sparse_mla.metadata import plan_decode

    info = _msa_plan_from_lengths(torch.tensor([3]), torch.tensor([300]), 4, 2, page_size=128, kv_block_num=4,
                                  sparse_kernel_mode="prefill")
    snap = snapshot_tensors([info])
    back = restore_tensors(snap, torch.device("cpu"))[0]
    assert type(back) is type(info) and type(back.plan) is type(info.plan)
    assert_equal(back.plan.kv_lens, info.plan.kv_lens)
    assert back.plan.kv_lens is not info.plan.kv_lens
    assert back.plan.workspace is not info.plan.workspace and back.plan.workspace.allocations == 0
    assert _nbytes(snap) >= info.plan.kv_lens.untyped_storage().nbytes()
    md = plan_decode(2, 1, 16, 64, "meta")
    snap = snapshot_tensors(md)
    assert snap.partial_o.__class__.__name__ == "_Scratch" and tuple(snap.partial_o.shape) == tuple(md.partial_o.shape)
    back = restore_tensors(snap, torch.device("cpu"))
    assert back.device == torch.device("cpu") and back.partial_o.device.type == "cpu"
    assert back.partial_o.shape == md.partial_o.shape and back.num_splits == md.num_splits
    back.check_matches(2, 1, 16, 64, torch.device("cpu"))  # usable by a decode on the replay device
