"""Validation helpers shared by every public op.

Each helper raises the exception type the conventions prescribe (``TypeError`` for a
wrong dtype, ``ValueError`` for shapes, layouts, devices and values,
``NotImplementedError`` for documented options that are not implemented) with a message
that names the argument, what was expected and what was given.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from mate._core.hopper import tma_aligned

__all__ = [
    "check_tensor",
    "check_tma_aligned",
    "check_no_overlap",
    "byte_ranges",
    "ByteRange",
    "launch_fits",
    "check_dtype",
    "check_shape",
    "check_ndim",
    "check_contiguous",
    "check_last_dim_contiguous",
    "check_same_device",
    "check_out_tensor",
    "check_value",
    "check_choice",
    "check_positive_int",
    "check_python_float",
    "check_default",
    "check_defaults",
    "check_inputs_enabled",
    "device_matches",
    "fmt_dtypes",
]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype)


def fmt_dtypes(dtypes: Iterable[torch.dtype]) -> str:
    names = [_dtype_name(d) for d in dtypes]
    return names[0] if len(names) == 1 else "one of (" + ", ".join(names) + ")"


def check_inputs_enabled() -> bool:
    """True when ``MATE_CHECK_INPUTS=1``: the expensive checks that need a host read run."""
    return os.environ.get("MATE_CHECK_INPUTS", "0").strip().lower() in ("1", "true", "yes", "on")


def check_is_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_dtype(name: str, t: torch.Tensor, dtypes: torch.dtype | Sequence[torch.dtype]) -> None:
    """``TypeError`` unless ``t.dtype`` is one of ``dtypes``."""
    check_is_tensor(name, t)
    allowed = (dtypes,) if isinstance(dtypes, torch.dtype) else tuple(dtypes)
    if t.dtype not in allowed:
        raise TypeError(f"{name} must be {fmt_dtypes(allowed)}, got {_dtype_name(t.dtype)}")


def check_ndim(name: str, t: torch.Tensor, ndims: int | Sequence[int]) -> None:
    allowed = (ndims,) if isinstance(ndims, int) else tuple(ndims)
    if t.dim() not in allowed:
        want = " or ".join(f"{n}-D" for n in allowed)
        raise ValueError(f"{name} must be {want}, got {t.dim()}-D with shape {tuple(t.shape)}")


def _fmt_shape(shape: Sequence[int | None | str]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_shape(name: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """``ValueError`` unless ``t.shape`` matches ``shape`` (``None`` matches any size)."""
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        raise ValueError(f"{name} must have shape {_fmt_shape(shape)}, got {list(t.shape)}")


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous, got shape {list(t.shape)} with strides {list(t.stride())}"
        )


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must have a contiguous last dimension (stride 1), got strides {list(t.stride())}"
        )


def device_matches(given: torch.device, wanted: torch.device | str) -> bool:
    """True when ``given`` is ``wanted``; a ``wanted`` without an index (``"cuda"``)
    matches every device of its type (``cuda:0`` included)."""
    if given == wanted:
        return True
    wanted = torch.device(wanted)
    return given.type == wanted.type and (wanted.index is None or given.index == wanted.index)


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """``ValueError`` unless every given tensor is on one device (``TypeError`` for an argument
    that is not a tensor); returns that device."""
    device = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        check_is_tensor(name, t)
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(f"{name} must be on {device} (the device of {first}), got {t.device}")
    if device is None:
        raise ValueError("at least one tensor argument is required")
    return device


def check_tensor(
    name: str,
    t: Any,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    ndim: int | Sequence[int] | None = None,
    contiguous: bool = False,
    last_dim_contiguous: bool = False,
    device: torch.device | None = None,
) -> torch.Tensor:
    """One call for the usual checks of a tensor argument, in the conventional order. Each
    test is inlined and the message built by the single check only when it fails: this runs
    several times per call of every op, on the host's critical path."""
    if not isinstance(t, torch.Tensor):
        check_is_tensor(name, t)
    if dtype is not None and t.dtype is not dtype and (isinstance(dtype, torch.dtype) or t.dtype not in dtype):
        check_dtype(name, t, dtype)
    if ndim is not None:
        n = t.dim()
        if n != ndim and (isinstance(ndim, int) or n not in ndim):
            check_ndim(name, t, ndim)
    if shape is not None:
        ts = t.shape
        if len(ts) != len(shape) or any(s is not None and s != d for s, d in zip(shape, ts)):
            check_shape(name, t, shape)
    if device is not None and not device_matches(t.device, device):
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        check_contiguous(name, t)
    if last_dim_contiguous:
        check_last_dim_contiguous(name, t)
    return t


def check_out_tensor(
    name: str,
    out: torch.Tensor,
    *,
    shape: Sequence[int],
    dtype: torch.dtype | Sequence[torch.dtype],
    device: torch.device,
    contiguous: bool = True,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    """Checks a caller-supplied output buffer; never reallocates a wrong one. A strided buffer
    must not overlap itself (an expanded view would make the kernels' stores race)."""
    check_tensor(
        name,
        out,
        dtype=dtype,
        shape=shape,
        device=device,
        contiguous=contiguous,
        last_dim_contiguous=last_dim_contiguous,
    )
    if not contiguous and not _non_overlapping(out):
        raise ValueError(f"{name} must not overlap itself (each element its own memory), got strides "
                         f"{tuple(out.stride())} for shape {tuple(out.shape)}")
    return out


def _non_overlapping(t: torch.Tensor) -> bool:
    """Whether no two elements of ``t`` share memory: ordered by stride, each dimension of size
    > 1 steps past the whole extent of the smaller ones (sufficient; the layouts it refuses,
    e.g. interleaved dimensions, are not ones an output buffer has)."""
    if t.numel() <= 1 or t.is_contiguous():
        return True
    extent = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride < extent:
            return False
        extent = stride * size
    return True


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte addresses ``t`` can touch (its strided extent)."""
    lo = hi = t.data_ptr()
    size = t.element_size()
    if t.is_contiguous():
        return lo, lo + max(t.numel(), 1) * size - 1
    for n, st in zip(t.shape, t.stride()):
        if n > 1:
            ext = (n - 1) * st * size
            if ext > 0:
                hi += ext
            else:
                lo += ext
    return lo, hi + size - 1


class ByteRange(NamedTuple):
    """A tensor's strided byte extent [lo, hi] on ``device`` (see :func:`byte_ranges`)."""

    lo: int
    hi: int
    device: torch.device


def byte_ranges(**tensors: torch.Tensor | None) -> dict[str, ByteRange]:
    """The byte extents of the non-empty ``tensors``, by name: inputs that several outputs of one
    call are checked against (:func:`check_no_overlap` takes them in place of the tensors)."""
    if torch.compiler.is_compiling():  # traced tensors have no address
        return {}
    return {name: ByteRange(*_byte_range(t), t.device) for name, t in tensors.items()
            if t is not None and t.numel()}


def check_no_overlap(out_name: str, out: torch.Tensor | None, /, **inputs: torch.Tensor | ByteRange | None) -> None:
    """``ValueError`` when the output ``out`` shares memory with one of ``inputs`` (tensors, or
    their :func:`byte_ranges`; a kernel that reads an input while writing its output would race):
    their strided extents must be disjoint (conservative for interleaved views, which outputs
    are not)."""
    if out is None or out.numel() == 0 or torch.compiler.is_compiling():  # traced tensors have no address
        return
    lo, hi = _byte_range(out)
    for name, t in inputs.items():
        if t is None:
            continue
        if isinstance(t, ByteRange):
            t_lo, t_hi, dev = t
        elif t.numel() == 0:
            continue
        else:
            (t_lo, t_hi), dev = _byte_range(t), t.device
        if dev != out.device:
            continue
        if lo <= t_hi and t_lo <= hi:
            raise ValueError(f"{out_name} must not overlap {name} (an input of the same call), "
                             f"got overlapping memory [{lo:#x}, {hi:#x}] and [{t_lo:#x}, {t_hi:#x}]")


def check_tma_aligned(name: str, t: torch.Tensor) -> None:
    """``ValueError`` unless a TMA descriptor can read ``t`` in place (see
    :func:`mate._core.hopper.tma_aligned`): kernels that read a cache through TMA."""
    if not tma_aligned(t):
        check_value(f"{name} (address and strides)", False, "16-byte aligned",
                    f"data_ptr % 16 = {t.data_ptr() % 16}, strides {list(t.stride())}")


def check_value(name: str, ok: bool, expected: str, given: Any) -> None:
    """``ValueError`` with the standard message unless ``ok``."""
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {given!r}")


def check_int32(name: str, value: int | torch.Tensor, expected: str | None = None) -> None:
    """``ValueError`` unless an int (or every element of an integer tensor, read on the host) fits
    int32, where a kernel or a plan stores it (a larger value would wrap silently)."""
    if isinstance(value, torch.Tensor):
        if value.numel():
            lo, hi = int(value.min()), int(value.max())
            check_value(name, lo >= -(2**31) and hi < 2**31, expected or "int32 values", f"values in [{lo}, {hi}]")
    else:
        check_value(name, -(2**31) <= value < 2**31, expected or "an int32 value", value)


def check_bool(name: str, value: Any) -> bool:
    """``TypeError`` unless ``value`` is a bool (a truthy string or int would silently pick a path)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices!r}, got {value!r}")


def check_positive_int(name: str, value: Any, *, multiple_of: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0 or value % multiple_of:
        what = "a positive int" if multiple_of == 1 else f"a positive multiple of {multiple_of}"
        raise ValueError(f"{name} must be {what}, got {value}")
    return value


def check_python_float(name: str, value: Any) -> float:
    """Scales passed as Python numbers; a tensor-valued scale is not implemented."""
    if isinstance(value, torch.Tensor):
        raise NotImplementedError(
            f"{name} must be a Python float; tensor-valued {name} is not implemented"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def check_defaults(given: dict[str, tuple[Any, Any]]) -> None:
    """:func:`check_default` for each ``name: (value, default)``; an argument that is its default
    object (``None``, a cached small int) costs one identity test."""
    for name, (value, default) in given.items():
        if value is not default:
            check_default(name, value, default)


def check_default(name: str, value: Any, default: Any) -> None:
    """``NotImplementedError`` when an argument that would change the result is not at its default."""
    if default is None or isinstance(default, bool) or isinstance(value, torch.Tensor):
        same = value is default  # a tensor is never a plain default (and has no truth value)
    else:
        same = value == default
    if not same:
        raise NotImplementedError(
            f"{name}={value!r} is not implemented (only the default {default!r} is supported)"
        )


@contextlib.contextmanager
def launch_fits(kernel: str, **config: Any) -> Iterator[None]:
    """Turns Triton's out-of-resources error of a launch inside the block into a ValueError
    naming ``kernel`` and its launch configuration (a plan's explicit tile or stage options can
    ask for more shared memory or registers than the GPU has). Formats nothing unless raised."""
    from triton.runtime.errors import OutOfResources

    try:
        yield
    except OutOfResources as exc:
        opts = ", ".join(f"{k}={v}" for k, v in config.items())
        raise ValueError(f"{kernel} with {opts} needs {exc.required} of {exc.name} but the GPU has {exc.limit}; "
                         "choose smaller tiles or fewer stages") from exc
