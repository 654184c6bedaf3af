"""Registration of public ops as ``torch.library`` custom ops.

Each public op calls one flat private op ``mate::<name>`` that takes only tensors and
plain scalars. Outputs are written into buffers the public function allocated (declared
in ``mutates_args``), so the custom op returns nothing or fresh tensors and never aliases
an input. The fake (meta) implementation lets ``torch.compile`` trace through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["mate_custom_op", "LIBRARY_NAMESPACE"]

LIBRARY_NAMESPACE = "mate"


def mate_custom_op(
    name: str,
    *,
    mutates_args: Sequence[str] | str = (),
    fake: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: registers ``fn`` as ``mate::name`` with an optional fake implementation.

    Ops that only mutate their buffers and return ``None`` need no ``fake``: one that
    does nothing is registered.
    """

    def wrap(fn: Callable[..., Any]) -> Any:
        mutated = mutates_args if isinstance(mutates_args, str) else tuple(mutates_args)
        op = torch.library.custom_op(f"{LIBRARY_NAMESPACE}::{name}", mutates_args=mutated)(fn)
        if fake is not None:
            op.register_fake(fake)
        else:

            def _noop_fake(*args: Any, **kwargs: Any) -> None:
                return None

            op.register_fake(_noop_fake)
        return op

    return wrap
