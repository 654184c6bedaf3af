"""Runs the ``Examples`` of every public function's docstring (doctest format) on the CPU.

The examples use CPU tensors and MATE_BACKEND unset, so the PyTorch references run; each
example draws random inputs and checks its result against a plain torch computation."""

from __future__ import annotations

import doctest
import inspect
import time

import pytest
from _doc_targets import API_MODULES, public_functions

CASES = [(f"{module}.{name}", fn) for module in API_MODULES for name, fn in public_functions(module)
         if module != "flashinfer"]  # the package root re-exports flashinfer.gemm (run there)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_examples(name: str, fn) -> tuple[int, str]:
    """Runs the docstring's examples; returns (number of examples, failure report)."""
    try:
        lineno = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        lineno = 0
    test = doctest.DocTestParser().get_doctest(fn.__doc__ or "", {}, name, inspect.getsourcefile(fn), lineno)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=report.append, clear_globs=True)
    return len(test.examples), "".join(report)


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


def test_a_wrong_example_fails():
    def bad():
        """
        >>> 1 + 1
        3
        """

    count, failures = run_examples("bad", bad)
    assert count == 1 and "Expected:\n    3\nGot:\n    2" in failures
