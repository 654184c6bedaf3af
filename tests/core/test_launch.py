"""``mate._core.launch``: the fast launch path against a stand-in JIT kernel (CPU).

The GPU suite launches every MHA kernel through it; here its bookkeeping is checked: the
first launch of a specialization goes through the kernel's own ``[grid]`` path, later ones
call the cached compiled kernel's launcher with the grid, the current stream and the bound
arguments, and anything that could change the compiled kernel or needs Triton's own path
(another specialization or launch option, a launch hook, debug mode) falls back.
"""

from __future__ import annotations

import pytest
import torch
from triton import knobs

from mate._core import launch as L
from tests.core._fake_triton import FakeJIT


def test_cached_launch_calls_the_compiled_launcher(fake):
    fast = L.launcher(fake)
    assert isinstance(fast, L.FastLaunch) and L.launcher(fake) is fast
    fast[(3,)](32, 7, BLOCK=64, num_warps=4)  # the first launch on the device creates the binder; cached
    assert len(fake.slow) == 1
    kernel = fake.compiled[-1]
    fast[(3,)](32, 7, BLOCK=64, num_warps=4)
    assert len(fake.slow) == 1
    fast[(5, 2)](48, 9, BLOCK=64, num_warps=4)  # same specialization (48 % 16 == 0, 9 neither 1 nor % 16)
    assert len(fake.slow) == 1
    assert kernel.calls == [(3, 1, 1, 1234, "function", "metadata", None, None, None, 32, 7, 64),
                            (5, 2, 1, 1234, "function", "metadata", None, None, None, 48, 9, 64)]


@pytest.mark.parametrize("change", ["value 1", "divisibility", "constexpr", "option"])
def test_another_specialization_takes_the_jit_path(fake, change):
    fast = L.launcher(fake)
    for _ in range(2):
        fast[(1,)](32, 7, BLOCK=64, num_warps=4)
    args, kw = {"value 1": ((32, 1), {}), "divisibility": ((33, 7), {}), "constexpr": ((32, 7), {"BLOCK": 128}),
                "option": ((32, 7), {"num_warps": 8})}[change]
    kwargs = {"BLOCK": 64, "num_warps": 4, **kw}
    assert len(fake.slow) == 1
    fast[(1,)](*args, **kwargs)
    assert len(fake.slow) == 2 and fake.slow[-1][1:] == (args, kwargs)
    fast[(1,)](*args, **kwargs)  # now cached too
    assert len(fake.slow) == 2 and len(fake.compiled[-1].calls) == 1


def test_hooks_and_debug_take_the_jit_path(fake, monkeypatch):
    fast = L.launcher(fake)
    for _ in range(2):
        fast[(1,)](32, 7, BLOCK=64, num_warps=4)
    hook = knobs.runtime.launch_enter_hook
    hook.add(print)
    try:
        fast[(1,)](32, 7, BLOCK=64, num_warps=4)
    finally:
        hook.remove(print)
    assert len(fake.slow) == 2
    monkeypatch.setattr(knobs.runtime, "debug", True)
    fast[(1,)](32, 7, BLOCK=64, num_warps=4)
    assert len(fake.slow) == 3
    monkeypatch.setattr(knobs.runtime, "debug", False)
    fast[(1,)](32, 7, BLOCK=64, num_warps=4)
    assert len(fake.slow) == 3


def test_launcher_passes_other_objects_through(fake, monkeypatch):
    stand_in = object()
    assert L.launcher(stand_in) is stand_in  # not a compiled JIT kernel (a test's recorder)
    monkeypatch.setattr(L, "FAST_LAUNCH", False)
    other = FakeJIT()
    assert L.launcher(other) is other
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    monkeypatch.setattr(L, "interpreter_active", lambda: True)
    assert L.launcher(other) is other


if torch.cuda.is_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _double_kernel(x_ptr, y_ptr, n, stride, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs * stride, tl.load(x_ptr + offs * stride, mask=mask) * 2, mask=mask)


@pytest.mark.gpu
def test_fast_launch_runs_the_right_specialization_on_the_gpu():
    """A specialization change between launches (a length divisible by 16 or not, equal to 1, a
    stride, a pointer off 16-byte alignment) must reach a kernel compiled for it: each launch's
    result is checked, the strided and misaligned ones included."""
    fast = L.launcher(_double_kernel)
    assert isinstance(fast, L.FastLaunch)
    cases = [(64, 1, 0), (64, 1, 0), (33, 1, 0), (1, 1, 0), (64, 2, 0), (64, 1, 1), (64, 1, 1), (48, 1, 0), (33, 1, 0)]
    for n, stride, offset in cases:
        base = torch.randn(n * stride + offset + 16, device="cuda")
        x = base[offset:]
        y_base = torch.full_like(base, float("nan"))
        y = y_base[offset:]
        fast[(triton.cdiv(n, 32),)](x, y, n, stride, BLOCK=32)
        torch.cuda.synchronize()
        touched = torch.zeros_like(y, dtype=torch.bool)
        touched[: n * stride : stride] = True
        assert torch.equal(y[touched], 2 * x[touched]), (n, stride, offset)
        assert torch.isnan(y[~touched]).all(), (n, stride, offset)
        assert torch.isnan(y_base[:offset]).all()
    assert len(fast.cache) >= 5  # 64 / 33 / 1 / stride 2 / misaligned are different specializations


def test_every_kernel_launch_in_the_package_goes_through_the_launcher():
    """``kernel[grid](...)`` anywhere in ``mate`` outside ``mate._core.launch`` is written
    ``launcher(kernel)[grid](...)``, so every launch (plain Triton and Gluon) takes the cached
    path and is seen by launch recordings; a direct launch would be invisible to a recipe."""
    import ast
    import pathlib

    import mate

    root = pathlib.Path(mate.__file__).parent
    direct = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "launch.py" and path.parent.name == "_core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                base = node.func.value
                if not (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "launcher"):
                    direct.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}")
    assert not direct, direct
