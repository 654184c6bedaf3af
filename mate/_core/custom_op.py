"""Registration of public ops as ``torch.library`` custom ops.

Each public op calls one flat private op ``mate::<name>`` that takes only tensors and
plain scalars. Outputs are written into buffers the public function allocated (declared
in ``mutates_args``), so the custom op returns nothing or fresh tensors and never aliases
an input. The fake (meta) implementation lets ``torch.compile`` trace through it.

An eager call runs the implementation directly: the dispatcher's Python layers of a
``torch.library.custom_op`` (autograd, ADInplaceOrView, filling defaults from the schema)
cost tens of microseconds of host time per call, more than many of the kernels take.
The registered op (``torch.ops.mate.<name>``) runs when ``torch.compile`` / ``torch.export``
trace the call or a ``TorchDispatchMode`` (fake tensors, ``make_fx``) is active.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._C import _len_torch_dispatch_stack

__all__ = ["mate_custom_op", "LIBRARY_NAMESPACE", "MateOp"]

LIBRARY_NAMESPACE = "mate"

EAGER_DIRECT = True
"""Eager calls skip the dispatcher (see the module docstring); False routes every call
through the registered op (``benchmarks/probe_host_overhead.py`` times both)."""


class MateOp:
    """A registered op: called eagerly it runs the implementation; traced, or under a
    dispatch mode, it runs ``op``, the ``torch.library`` custom op."""

    def __init__(self, fn: Callable[..., Any], op: Any) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.op = op

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if EAGER_DIRECT and not torch.compiler.is_compiling() and not _len_torch_dispatch_stack():
            return self.fn(*args, **kwargs)
        return self.op(*args, **kwargs)


def mate_custom_op(
    name: str,
    *,
    mutates_args: Sequence[str] | str = (),
    fake: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: registers ``fn`` as ``mate::name`` with an optional fake implementation
    and returns a :class:`MateOp` (``.op`` is the registered custom op).

    Ops that only mutate their buffers and return ``None`` need no ``fake``: one that
    does nothing is registered.
    """

    def wrap(fn: Callable[..., Any]) -> MateOp:
        mutated = mutates_args if isinstance(mutates_args, str) else tuple(mutates_args)
        op = torch.library.custom_op(f"{LIBRARY_NAMESPACE}::{name}", mutates_args=mutated)(fn)
        if fake is not None:
            op.register_fake(fake)
        else:

            def _noop_fake(*args: Any, **kwargs: Any) -> None:
                return None

            op.register_fake(_noop_fake)
        return MateOp(fn, op)

    return wrap
