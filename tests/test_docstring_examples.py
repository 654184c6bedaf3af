"""Runs the ``Examples`` of every public function's docstring, and the ``pycon`` blocks of
the guides in docs/ (doctest format), on the CPU.

The examples use CPU tensors and MATE_BACKEND unset, so the PyTorch references run; each
example draws random inputs and checks its result against a plain torch computation."""

from __future__ import annotations

import doctest
import inspect
import re
import time

import pytest
from _doc_targets import API_MODULES, ROOT, public_functions

CASES = [(f"{module}.{name}", fn) for module in API_MODULES for name, fn in public_functions(module)
         if module != "flashinfer"]  # the package root re-exports flashinfer.gemm (run there)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
PYCON = re.compile(r"^```pycon\n(.*?)^```", re.M | re.S)
GUIDES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts and PYCON.search(p.read_text()))


def run_text(text: str, name: str, filename: str, lineno: int = 0) -> tuple[int, str]:
    """Runs the doctest examples of ``text``; returns (number of examples, failure report)."""
    test = doctest.DocTestParser().get_doctest(text, {}, name, filename, lineno)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=report.append, clear_globs=True)
    return len(test.examples), "".join(report)


def run_examples(name: str, fn) -> tuple[int, str]:
    """Runs the examples of a function's docstring."""
    try:
        lineno = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        lineno = 0
    return run_text(fn.__doc__ or "", name, inspect.getsourcefile(fn), lineno)


def test_cases_were_found():
    assert len(CASES) >= 20, f"only {len(CASES)} public functions found: the inspection is broken"


@pytest.mark.parametrize(("name", "fn"), CASES, ids=[c[0] for c in CASES])
def test_docstring_examples_run_on_cpu(name, fn, monkeypatch):
    monkeypatch.delenv("MATE_BACKEND", raising=False)
    monkeypatch.delenv("MATE_CHECK_INPUTS", raising=False)
    start = time.perf_counter()
    count, failures = run_examples(name, fn)
    assert count > 0, f"{name}: the docstring has no >>> example"
    assert not failures, failures
    assert time.perf_counter() - start < 30, f"{name}: examples must stay small (took > 30 s)"


@pytest.mark.parametrize("page", GUIDES, ids=[str(p.relative_to(ROOT)) for p in GUIDES])
def test_guide_examples_run_on_cpu(page, monkeypatch):
    """The ``pycon`` blocks of one page run as one session (later blocks see earlier names)."""
    monkeypatch.delenv("MATE_BACKEND", raising=False)
    monkeypatch.delenv("MATE_CHECK_INPUTS", raising=False)
    blocks = PYCON.findall(page.read_text())
    count, failures = run_text("\n".join(blocks), page.name, str(page))
    assert count > 0 and not failures, failures


def test_guides_have_examples():
    assert {"sparse_mla.md", "msa.md", "gemm.md"} <= {p.name for p in GUIDES}, GUIDES


def test_a_wrong_example_fails():
    def bad():
        """
        >>> 1 + 1
        3
        """

    count, failures = run_examples("bad", bad)
    assert count == 1 and "Expected:\n    3\nGot:\n    2" in failures
