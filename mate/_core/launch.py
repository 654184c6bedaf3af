"""Triton kernel launches with less host time per call (eager calls of the hot ops).

``JITFunction[grid](...)`` costs about 31-36 us of host time per launch on the H200 machine's
host (Triton 3.6, ``benchmarks/probe_launch_overhead.py``): the argument binder (~10 us), a
cache key built from ``str(options)``, a global-value check, launch metadata and the launch.
:class:`FastLaunch` keeps the binder, whose per-argument specialization is the exact key of
Triton's own kernel cache, and replaces the rest with one dict lookup and a direct call of the
compiled kernel's launcher (``CompiledKernel.run``): 7-17 us. The first launch of each
specialization, and every launch under the interpreter, with launch hooks (profilers) or
``TRITON_DEBUG``, or with ``MATE_FAST_LAUNCH=0`` at import, goes through ``JITFunction``
unchanged. Every kernel launch in ``mate.ops`` goes through :func:`launcher`, the Gluon kernels'
too (``GluonJITFunction`` is a ``JITFunction`` with the same binder and compiled-kernel launch).
Inside :func:`recording` the cached launches are also recorded, for the launch recipes of
:mod:`mate._core.recipe`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from mate._core.dispatch import interpreter_active

__all__ = ["FastLaunch", "launcher", "FAST_LAUNCH", "Recording", "recording", "active_recording", "plain_launches"]

FAST_LAUNCH = os.environ.get("MATE_FAST_LAUNCH", "1").strip().lower() not in ("0", "false", "no", "off")
"""Read once at import; ``MATE_FAST_LAUNCH=0`` launches every kernel through ``JITFunction``."""


class Recording:
    """The launches made through :class:`FastLaunch` inside :func:`recording`: (compiled kernel,
    grid (x, y, z), bound argument values) each. ``complete`` turns False when a launch took
    ``JITFunction``'s path (a first launch, a hook, debug mode), which records nothing."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, tuple[int, int, int], tuple]] = []
        self.complete = True
        self.device = -1


_LOCAL = threading.local()


def active_recording() -> Recording | None:
    """The innermost :func:`recording` of this thread, if any."""
    return getattr(_LOCAL, "recording", None)


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Records this thread's :class:`FastLaunch` launches (see :mod:`mate._core.recipe`)."""
    previous = active_recording()
    rec = Recording()
    _LOCAL.recording = rec
    try:
        yield rec
    finally:
        _LOCAL.recording = previous


def plain_launches() -> bool:
    """Whether a launch may bypass ``JITFunction``: no launch hooks, no Triton debug mode."""
    from triton import knobs

    rt = knobs.runtime
    return not (rt.debug or rt.launch_enter_hook.calls or rt.launch_exit_hook.calls)


def _supported(fn: Any) -> bool:
    """Whether ``fn`` and this Triton have the internals the fast path uses (Triton 3.6's): a
    compiled ``JITFunction`` (not the interpreter's), per-device binders, hook chains."""
    try:
        from triton import knobs

        return (hasattr(fn, "device_caches") and hasattr(fn, "pre_run_hooks")
                and hasattr(knobs.runtime.launch_enter_hook, "calls")
                and hasattr(knobs.runtime.launch_exit_hook, "calls")
                and hasattr(knobs.compilation, "instrumentation_mode"))
    except Exception:  # pragma: no cover - another Triton layout
        return False


class FastLaunch:
    """``FastLaunch(kernel)[grid](*args, **kwargs)`` launches as ``kernel[grid](*args, **kwargs)``
    does, with the same compiled kernel and arguments (use :func:`launcher`).

    The cache key is (device, the binder's specialization of every argument, the launch
    options, the instrumentation mode): the specialization is what selects a compiled kernel in
    Triton's own cache (dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible
    by 16, constexpr values, tensor-descriptor block shapes), so a hit is the kernel that
    ``JITFunction`` would run.
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.cache: dict[tuple, Any] = {}

    def __getitem__(self, grid: tuple[int, ...]):
        def launch(*args: Any, **kwargs: Any) -> Any:
            return self.run(grid, args, kwargs)

        return launch

    def run(self, grid: tuple[int, ...], args: tuple, kwargs: dict) -> Any:
        rec = active_recording()
        if not plain_launches() or self.fn.pre_run_hooks:
            if rec is not None:
                rec.complete = False
            return self.fn[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        caches = self.fn.device_caches.get(device)
        if caches is None:  # the first launch on this device creates the binder
            if rec is not None:
                rec.complete = False
            return self._first(None, grid, args, kwargs)
        bound, key = self._bind(device, caches, args, kwargs)
        kernel = self.cache.get(key)
        if kernel is None:
            if rec is not None:
                rec.complete = False
            return self._first(key, grid, args, kwargs)
        n = len(grid)
        g = (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1)
        values = tuple(bound.values())
        kernel.run(g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *values)
        if rec is not None:
            if rec.device not in (-1, device):
                rec.complete = False
            rec.device = device
            rec.launches.append((kernel, g, values))
        return kernel

    @staticmethod
    def _bind(device: int, caches: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple]:
        """(bound arguments, cache key) by the device's binder: the key is what selects a compiled
        kernel in Triton's own cache (see the class docstring)."""
        from triton import knobs

        bound, specialization, options = caches[4](*args, **kwargs)
        return bound, (device, tuple(specialization), tuple(options.items()), knobs.compilation.instrumentation_mode)

    def _first(self, key: tuple | None, grid: tuple[int, ...], args: tuple, kwargs: dict) -> Any:
        kernel = self.fn[grid](*args, **kwargs)
        if key is None:  # the device's first launch, which made the binder: the key now exists
            device = torch.cuda.current_device()
            caches = self.fn.device_caches.get(device)
            if caches is not None:
                key = self._bind(device, caches, args, kwargs)[1]
        if key is not None and kernel is not None and not hasattr(kernel, "result") and kernel.function is not None:
            self.cache[key] = kernel
        return kernel


def launcher(fn: Any) -> Any:
    """What to index with the grid to launch ``fn``: its :class:`FastLaunch` (made once, kept on
    the kernel) where the fast path applies, else ``fn`` itself (the interpreter, another Triton,
    ``MATE_FAST_LAUNCH=0``, a stand-in object of a test)."""
    fast = getattr(fn, "_mate_fast_launch", None)
    if fast is not None:
        return fast
    if not FAST_LAUNCH or interpreter_active() or not _supported(fn):
        return fn
    fast = FastLaunch(fn)
    fn._mate_fast_launch = fast
    return fast
