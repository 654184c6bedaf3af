"""Small public functions decorated with ``mate_api`` for the logging, dump and replay
tests. ``mate_api`` reads ``MATE_LOGLEVEL`` when :mod:`mate.api_logging` is imported, so
the tests import this module in subprocesses with the environment set (it is importable
as ``_demo_ops`` with ``tests/core`` on ``PYTHONPATH``, which is also what ``mate replay``
needs to find the functions of a dump).
"""

from __future__ import annotations

import torch

from mate._core.checks import check_out_tensor, check_tensor
from mate.api_logging import mate_api

__all__ = ["scale_rows", "split_quantize", "takes_anything", "Unprintable"]


@mate_api
def scale_rows(x: torch.Tensor, scale: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out = x * scale`` in fp32.

    Parameters
    ----------
    x : torch.Tensor
        ``[rows, cols]``, float32 or bfloat16, any strides.
    scale : float
        Multiplier.
    out : torch.Tensor, optional
        ``[rows, cols]`` float32 buffer to write (any strides); allocated when omitted.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    check_tensor("x", x, dtype=(torch.float32, torch.bfloat16), ndim=2)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    check_out_tensor("out", out, shape=tuple(x.shape), dtype=torch.float32, device=x.device, contiguous=False)
    out.copy_(x.float() * scale)
    return out


@mate_api
def split_quantize(
    x: torch.Tensor, q_out: torch.Tensor, r_out: torch.Tensor, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Splits the last dimension of ``x`` into an FP8 part and a bf16 part, written into
    the given buffers (typically two views of one merged buffer).

    Parameters
    ----------
    x : torch.Tensor
        ``[rows, dq + dr]`` float32, last dimension contiguous.
    q_out : torch.Tensor
        ``[rows, dq]`` float8_e4m3fn: ``x[:, :dq] * scale``, saturated to +-448.
    r_out : torch.Tensor
        ``[rows, dr]`` bfloat16: ``x[:, dq:]``.
    scale : float
        Multiplier of the FP8 part.

    Returns
    -------
    tuple of torch.Tensor
        ``(q_out, r_out)``.
    """
    check_tensor("x", x, dtype=torch.float32, ndim=2, last_dim_contiguous=True)
    dq = q_out.shape[-1]
    check_out_tensor("q_out", q_out, shape=(x.shape[0], dq), dtype=torch.float8_e4m3fn, device=x.device,
                     contiguous=False, last_dim_contiguous=True)
    check_out_tensor("r_out", r_out, shape=(x.shape[0], x.shape[1] - dq), dtype=torch.bfloat16,
                     device=x.device, contiguous=False, last_dim_contiguous=True)
    q_out.copy_((x[:, :dq] * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
    r_out.copy_(x[:, dq:].to(torch.bfloat16))
    return q_out, r_out


class Unprintable:
    """An argument whose ``repr`` and pickling both fail."""

    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")

    def __reduce__(self):
        raise RuntimeError("pickling exploded")


@mate_api
def takes_anything(x: torch.Tensor, obj: object = None) -> torch.Tensor:
    """``x + 1``; ``obj`` is ignored (it exists to carry odd arguments into the logger)."""
    return x + 1
