"""The package's surface: exactly the listed names, upstream's signatures, version, backends."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import subprocess
import sys
from pathlib import Path

import flashinfer
import flashinfer.decode
import flashinfer.gemm
import flashinfer.rope
import pytest
import torch
from flashinfer._compat import UPSTREAM_BACKENDS

HERE = Path(__file__).resolve().parent
UPSTREAM = json.loads((HERE / "upstream_signatures.json").read_text())
MODULES = {name: importlib.import_module(name) for name in UPSTREAM["modules"]}
APPENDED = UPSTREAM["documented_differences"]["appended"]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None


@pytest.mark.parametrize("module_name", sorted(UPSTREAM["modules"]))
def test_surface_is_exactly_the_listed_names(module_name):
    mod = MODULES[module_name]
    listed = set(UPSTREAM["modules"][module_name])
    assert set(mod.__all__) == listed
    # Every public function or class reachable from the module is a listed one: no helper,
    # no extra upstream name, leaks out.
    public = {
        n for n, v in vars(mod).items()
        if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
        and getattr(v, "__module__", "").startswith("flashinfer")
    }
    assert public == listed
    # nor does a mate helper under a public name (e.g. the logging decorator)
    assert not {n for n, v in vars(mod).items() if not n.startswith("_") and callable(v)
                and getattr(v, "__module__", "").startswith("mate")}
    star: dict = {}
    exec(f"from {module_name} import *", star)  # noqa: S102 - the star-import surface
    assert {n for n in star if not n.startswith("__")} == listed
    # Submodules the root exposes are only the three documented ones.
    submodules = {n for n, v in vars(mod).items()
                  if inspect.ismodule(v) and v.__name__.startswith("flashinfer.") and not n.startswith("_")}
    assert submodules <= {"gemm", "rope", "decode"}


def test_root_exports_are_the_gemm_functions():
    assert flashinfer.bmm_bf16 is flashinfer.gemm.bmm_bf16
    assert flashinfer.bmm_fp8 is flashinfer.gemm.bmm_fp8


def test_submodules_are_attributes_of_the_package():
    """After a bare ``import flashinfer`` (a fresh interpreter) the three submodules are
    reachable as attributes, as upstream, where SGLang calls
    ``flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla``."""
    code = "import flashinfer; print(flashinfer.decode.__name__, flashinfer.rope.__name__, flashinfer.gemm.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["flashinfer.decode", "flashinfer.rope", "flashinfer.gemm"]


def _function(name):
    for module_name, names in UPSTREAM["modules"].items():
        if name in names:
            return getattr(MODULES[module_name], name)
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(UPSTREAM["functions"]))
def test_signature_matches_upstream(name):
    """Names, order and defaults equal upstream's, except the documented differences."""
    params = list(inspect.signature(_function(name)).parameters.values())
    expected = UPSTREAM["functions"][name] + APPENDED.get(name, [])
    assert [p.name for p in params] == [e["name"] for e in expected]
    for p, e in zip(params, expected):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, p
        if p.name == "backend":
            assert p.default == "auto", "backend defaults to 'auto' everywhere (documented difference)"
        elif e["default"] == "<required>":
            assert p.default is inspect.Parameter.empty, p
        else:
            assert repr(p.default) == e["default"], (p.name, p.default, e["default"])


def test_only_backend_defaults_and_appended_arguments_differ():
    """The recorded differences are the only ones: appended arguments come last."""
    for name, appended in APPENDED.items():
        params = list(inspect.signature(_function(name)).parameters)
        assert params[-len(appended):] == [a["name"] for a in appended]
    differing = [n for n, ps in UPSTREAM["functions"].items()
                 for p in ps if p["name"] == "backend" and p["default"] != "'auto'"]
    assert sorted(differing) == ["bmm_bf16", "bmm_fp8", "gemm_fp8_nt_groupwise"]


def test_version():
    assert flashinfer.__version__ == "0.6.17+mate"
    if tomllib is not None:
        project = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]
        assert project["name"] == "flashinfer-python"
        assert project["version"] == flashinfer.__version__
        assert project["dependencies"] == ["mate-kernels"]
    try:
        installed = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    from_tree = Path(flashinfer.__file__).resolve().is_relative_to(HERE.parent)
    if installed is None or (not installed.endswith("+mate") and from_tree):
        # Used from the source tree through PYTHONPATH (the GPU runner), which takes precedence
        # over whatever flashinfer-python that machine has installed.
        assert from_tree
        return
    assert installed == "0.6.17+mate"  # pip show flashinfer-python


def test_every_function_has_a_docstring_with_parameters():
    for name in UPSTREAM["functions"]:
        doc = inspect.getdoc(_function(name)) or ""
        assert "Parameters" in doc and "Returns" in doc, name


@pytest.mark.parametrize("backend", UPSTREAM_BACKENDS)
def test_upstream_backend_names_mean_mate_chooses(monkeypatch, backend):
    """Every upstream backend name is accepted and reaches mate as ``"auto"``."""
    import mate.gemm

    seen = {}

    def spy(A, B, out=None, out_dtype=torch.bfloat16, backend="auto"):
        seen["backend"] = backend
        return out

    monkeypatch.setattr(mate.gemm, "bmm_bf16", spy)
    flashinfer.gemm.bmm_bf16(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), backend=backend)
    assert seen["backend"] == "auto"


@pytest.mark.parametrize("fn", ["bmm_bf16", "bmm_fp8", "gemm_fp8_nt_groupwise"])
def test_unknown_backend_raises(fn):
    args = {
        "bmm_bf16": (torch.zeros(1, 1, 1), torch.zeros(1, 1, 1)),
        "bmm_fp8": (torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.ones(1), torch.ones(1), torch.bfloat16),
        "gemm_fp8_nt_groupwise": (torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1)),
    }[fn]
    with pytest.raises(ValueError, match="backend"):
        getattr(flashinfer.gemm, fn)(*args, backend="not-a-backend")
