"""API logging, statistics and dumps for every public mate function.

``@mate_api`` wraps each public function. Its behaviour is configured by environment
variables read once, when this module is imported:

- ``MATE_LOGLEVEL``: 0 (default) makes the decorator return the function itself (no
  overhead); 1 logs the function name before each call; 3 adds every argument and result
  (tensor shape, stride, dtype, device); 5 adds tensor statistics (min, max, mean,
  NaN/Inf counts), skipped while a CUDA graph is being captured; 10 adds a dump of the
  inputs before and the outputs after each call.
- ``MATE_LOGDEST``: ``stdout``, ``stderr`` (default) or a file path; ``%i`` becomes the
  process id.
- ``MATE_DUMP_DIR``, ``MATE_DUMP_MAX_SIZE_GB``, ``MATE_DUMP_MAX_COUNT``,
  ``MATE_DUMP_INCLUDE``, ``MATE_DUMP_EXCLUDE``: where dumps go, their total size and
  count limits, and comma-separated fnmatch patterns on function names that select which
  calls are dumped.

A failure inside logging or dumping is reported on the log destination and never
reaches the caller.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import fnmatch
import functools
import itertools
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["mate_api", "LogConfig", "CONFIG", "snapshot_tensors", "restore_tensors"]


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _env_patterns(name: str) -> tuple[str, ...]:
    raw = os.environ.get(name, "")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """The logging configuration in force (read from the environment once)."""

    level: int
    dest: str
    dump_dir: str
    dump_max_size_gb: float
    dump_max_count: int
    dump_include: tuple[str, ...]
    dump_exclude: tuple[str, ...]

    @classmethod
    def from_env(cls) -> LogConfig:
        try:
            level = int(os.environ.get("MATE_LOGLEVEL", "0"))
        except ValueError:
            level = 0
        return cls(
            level=level,
            dest=os.environ.get("MATE_LOGDEST", "stderr"),
            dump_dir=os.environ.get("MATE_DUMP_DIR", "mate_dumps"),
            dump_max_size_gb=_env_float("MATE_DUMP_MAX_SIZE_GB", 20.0),
            dump_max_count=int(_env_float("MATE_DUMP_MAX_COUNT", 1000)),
            dump_include=_env_patterns("MATE_DUMP_INCLUDE"),
            dump_exclude=_env_patterns("MATE_DUMP_EXCLUDE"),
        )


#: The configuration read from the environment when :mod:`mate.api_logging` was imported.
CONFIG = LogConfig.from_env()

_lock = threading.Lock()
_stream = None
_call_counter = itertools.count(1)
_dump_state = {"count": 0, "bytes": 0}


def _log_stream():
    global _stream
    if _stream is None:
        dest = CONFIG.dest
        if dest == "stdout":
            _stream = sys.stdout
        elif dest == "stderr":
            _stream = sys.stderr
        else:
            path = Path(dest.replace("%i", str(os.getpid())))
            path.parent.mkdir(parents=True, exist_ok=True)
            _stream = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the process
    return _stream


def _emit(line: str) -> None:
    with _lock:
        stream = _log_stream()
        stream.write(line + "\n")
        stream.flush()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _describe(value: Any, with_stats: bool) -> str:
    if isinstance(value, torch.Tensor):
        text = (
            f"Tensor(shape={list(value.shape)}, stride={list(value.stride())}, "
            f"dtype={value.dtype}, device={value.device})"
        )
        if with_stats and not _capturing():
            text += " " + _stats(value)
        return text
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v, with_stats) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe(v, with_stats)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a plan: its tensors and values
        inner = ", ".join(f"{f.name}={_describe(getattr(value, f.name), with_stats)}"
                          for f in dataclasses.fields(value) if f.repr)
        return f"{type(value).__name__}({inner})"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _stats(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return "{empty}"
    x = t.detach()
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or x.dtype.is_floating_point:
        x = x.float()
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
        finite = x[torch.isfinite(x)]
        if finite.numel() == 0:
            return f"{{nan={nan}, inf={inf}}}"
        return (
            f"{{min={finite.min().item():.6g}, max={finite.max().item():.6g}, "
            f"mean={finite.mean().item():.6g}, nan={nan}, inf={inf}}}"
        )
    if x.dtype == torch.bool:
        return f"{{true={int(x.sum())}}}"
    if x.is_complex():
        return "{complex}"
    return f"{{min={x.min().item()}, max={x.max().item()}, mean={x.double().mean().item():.6g}}}"


# ---------------------------------------------------------------------------- dumps


def snapshot_tensors(value: Any) -> Any:
    """Deep-copies the tensors in ``value`` to the CPU, keeping shapes, strides and dtypes.

    A strided view is copied with the span of storage it covers, so that a replay writes
    through the same strides (for example an output that is a slice of a merged buffer).
    Used by the level-10 dumps and by ``mate replay``.

    Parameters
    ----------
    value : Any
        A tensor, or lists / tuples (named tuples keep their type) / dicts / dataclasses
        nesting tensors; a dataclass field declared ``compare=False`` (scratch space) is
        kept as its shape and dtype only, or reset to its ``default_factory``; other
        objects are kept as they are.

    Returns
    -------
    Any
        The same structure with every tensor replaced by a detached CPU copy with the
        original shape, strides and dtype.

    Raises
    ------
    RuntimeError
        only from torch itself (for example when a device copy fails).

    Examples
    --------
    >>> import torch
    >>> from mate.api_logging import snapshot_tensors
    >>> x = torch.arange(12.0).reshape(3, 4)[:, 1:3]  # a strided view
    >>> snap = snapshot_tensors({"x": x, "n": 7})
    >>> snap["x"].stride(), torch.equal(snap["x"], x), snap["n"]
    ((4, 1), True, 7)
    """
    return _map_structure(value, lambda t: _copy_keep_strides(t, torch.device("cpu")), scratch=_Scratch.of)


def restore_tensors(value: Any, device: torch.device) -> Any:
    """Moves the tensors of a snapshot to ``device``, keeping strides.

    Parameters
    ----------
    value : Any
        A structure returned by :func:`snapshot_tensors`.
    device : torch.device
        Where the tensors go.

    Returns
    -------
    Any
        The same structure with every tensor copied to ``device`` (fresh storage, same
        shape, strides and dtype), scratch fields allocated there (uninitialised) and the
        ``torch.device`` fields of dataclasses set to ``device``.

    Raises
    ------
    RuntimeError
        only from torch itself (for example an unavailable device).

    Examples
    --------
    >>> import torch
    >>> from mate.api_logging import restore_tensors, snapshot_tensors
    >>> x = torch.arange(12.0).reshape(3, 4).t()
    >>> back = restore_tensors(snapshot_tensors([x]), torch.device("cpu"))
    >>> back[0].stride() == x.stride(), torch.equal(back[0], x)
    (True, True)
    """
    return _map_structure(value, lambda t: _copy_keep_strides(t, device), scratch=lambda spec: spec.allocate(device),
                          device=device)


def _copy_keep_strides(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A detached copy of ``t`` on ``device`` in fresh storage with the same shape, strides and
    dtype (the elements its strides reach, from its storage offset on)."""
    t = t.detach()
    if t.numel() == 0:
        return t.to(device).clone()
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    flat = t.as_strided((span,), (1,), t.storage_offset()).to(device).clone()
    return flat.as_strided(t.shape, t.stride(), 0)


@dataclasses.dataclass(frozen=True)
class _Scratch:
    """A dumped stand-in for a scratch tensor (a dataclass field with ``compare=False``, such
    as a decode plan's partial-output buffers): its shape and dtype, re-allocated on replay
    instead of saving its contents."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @staticmethod
    def of(t: torch.Tensor) -> _Scratch:
        return _Scratch(tuple(t.shape), t.dtype)

    def allocate(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)


def _map_structure(value: Any, fn: Callable[[torch.Tensor], Any], *, scratch: Callable[[Any], Any],
                   device: torch.device | None = None) -> Any:
    """``value`` with ``fn`` applied to every tensor inside lists, tuples (named tuples keep
    their type), dicts and dataclasses (copied field by field). A dataclass field declared
    ``compare=False`` is not part of the value: a tensor there goes through ``scratch``, one
    with a ``default_factory`` (e.g. a plan's workspace) starts afresh. With ``device``, a
    dataclass's ``torch.device`` fields become it (a plan restored on another device)."""
    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return fn(v)
        if isinstance(v, _Scratch):
            return scratch(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            items = [walk(x) for x in v]
            return type(v)(*items) if hasattr(v, "_fields") else tuple(items)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            new = copy.copy(v)
            for f in dataclasses.fields(v):
                x = getattr(v, f.name)
                if not f.compare and f.default_factory is not dataclasses.MISSING:
                    x = f.default_factory()
                elif not f.compare and isinstance(x, torch.Tensor):
                    x = scratch(x)
                elif device is not None and isinstance(x, torch.device):
                    x = device
                else:
                    x = walk(x)
                object.__setattr__(new, f.name, x)
            return new
        return v

    return walk(value)


def _tensors_in(value: Any) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in ``value`` (the structures of :func:`snapshot_tensors`),
    e.g. ``("[1]", t)``, ``("['out']", t)`` or ``("[0].plan.kv_lens", t)``; a dataclass's
    ``compare=False`` fields (scratch, not part of the value) are left out. Reads only."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, torch.Tensor):
            found.append((path, v))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}[{k!r}]")
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            for f in dataclasses.fields(v):
                if f.compare:
                    walk(getattr(v, f.name), f"{path}.{f.name}")

    walk(value, "")
    return found


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _nbytes(value: Any) -> int:
    return sum(t.untyped_storage().nbytes() for _, t in _tensors_in(value))


def _dump_selected(*names: str) -> bool:
    """Whether the include / exclude patterns select a function known by any of ``names``
    (its short name, ``bmm_fp8``, and its dotted name, ``mate.gemm.bmm_fp8``)."""
    def hit(patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatch(name, p) for name in names for p in patterns)

    if CONFIG.dump_include and not hit(CONFIG.dump_include):
        return False
    return not hit(CONFIG.dump_exclude)


def _first_device(value: Any) -> str:
    found = _tensors_in(value)
    return str(found[0][1].device) if found else ""


class _Dump:
    """One call's dump folder."""

    def __init__(self, qualname: str, short: str, call_id: int, args: tuple, kwargs: dict):
        root = Path(CONFIG.dump_dir)
        stamp = _dt.datetime.now().strftime("%Y%m%d_%H%M%S_%f")
        self.root = root
        self.dir = root / f"{stamp}_pid{os.getpid()}_{short}_call{call_id:04d}"
        self.qualname = qualname
        self.inputs = {"args": snapshot_tensors(list(args)), "kwargs": snapshot_tensors(dict(kwargs))}
        self.device = _first_device([args, kwargs])
        self.live = {"args": list(args), "kwargs": dict(kwargs)}

    def fits(self) -> bool:
        limit = CONFIG.dump_max_size_gb * (1 << 30)
        return (
            _dump_state["count"] < CONFIG.dump_max_count
            and _dump_state["bytes"] + _nbytes(self.inputs) <= limit
        )

    def mutated(self) -> dict[str, torch.Tensor]:
        """The tensor arguments the call changed (bitwise), as after the call, by path."""
        before = dict(_tensors_in(self.inputs))
        changed = {}
        for path, t in _tensors_in(self.live):
            after = snapshot_tensors(t)
            if path in before and not _same_bits(after, before[path]):
                changed[path] = after
        return changed

    def write(self, result: Any, error: str | None) -> None:
        outputs = {"result": snapshot_tensors(result), "mutated": self.mutated() if error is None else {}}
        size = _nbytes(self.inputs) + _nbytes(outputs)
        if _dump_state["bytes"] + size > CONFIG.dump_max_size_gb * (1 << 30):
            _emit(f"[mate] dump of {self.qualname} skipped: MATE_DUMP_MAX_SIZE_GB reached")
            return
        self.dir.mkdir(parents=True, exist_ok=False)
        try:
            torch.save(self.inputs, self.dir / "inputs.pt")
            torch.save(outputs, self.dir / "outputs.pt")
        except BaseException:
            # an argument torch.save cannot pickle: leave no half-written call folder
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        meta = {
            "function": self.qualname,
            "pid": os.getpid(),
            "time": _dt.datetime.now().isoformat(),
            "device": self.device,
            "torch": torch.__version__,
            "error": error,
            "bytes": size,
        }
        (self.dir / "metadata.json").write_text(json.dumps(meta, indent=2))
        with open(self.root / "session.jsonl", "a") as f:
            f.write(json.dumps({**meta, "dir": self.dir.name}) + "\n")
        _dump_state["count"] += 1
        _dump_state["bytes"] += size


# ---------------------------------------------------------------------------- decorator


def _safe(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # logging must never reach the caller
        with contextlib.suppress(Exception):
            _emit(f"[mate] logging failed during {what}: {type(exc).__name__}: {exc}")
        return None


def mate_api(fn: F) -> F:
    """Wraps a public function with logging and dumps as configured by ``MATE_LOGLEVEL``.

    The level is read once, at import. At level 0 (the default) the function itself is
    returned, so the decorator costs nothing. At level >= 1 each call is logged (the
    function name; at 3 its arguments and result; at 5 tensor statistics; at 10 the
    inputs and outputs are dumped for ``mate replay``), and the wrapper carries
    ``__mate_api__ = True``. A failure inside logging or dumping is reported on the log
    destination and never reaches the caller; exceptions of the function itself pass
    through unchanged.

    Parameters
    ----------
    fn : Callable
        The public function to wrap.

    Returns
    -------
    Callable
        ``fn`` itself at level 0, else a wrapper with the same signature (``functools.wraps``).

    Raises
    ------
    Exception
        nothing of its own: the wrapped function's exceptions are re-raised as they are.

    Examples
    --------
    >>> import torch
    >>> from mate.api_logging import mate_api
    >>> @mate_api
    ... def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    ...     return x * factor
    >>> scale(torch.ones(2), 3.0)
    tensor([3., 3.])
    >>> scale.__name__
    'scale'
    """
    level = CONFIG.level
    if level <= 0:
        return fn
    qualname = f"{fn.__module__}:{fn.__qualname__}"
    short = fn.__name__
    display = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call_id = next(_call_counter)
        _safe("call logging", lambda: _emit(f"[mate] call #{call_id} {display}"))
        if level >= 3:

            def log_args() -> None:
                for i, a in enumerate(args):
                    _emit(f"[mate]   arg{i} = {_describe(a, level >= 5)}")
                for k, v in kwargs.items():
                    _emit(f"[mate]   {k} = {_describe(v, level >= 5)}")

            _safe("argument logging", log_args)
        dump = None
        if level >= 10 and _dump_selected(short, display) and not _capturing():
            dump = _safe("input dump", lambda: _Dump(qualname, short, call_id, args, kwargs))
            if dump is not None and not _safe("dump limits", dump.fits):
                _safe("dump limit", lambda: _emit(f"[mate] dump of {display} skipped: dump limits reached"))
                dump = None
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            if dump is not None:
                message = f"{type(exc).__name__}: {exc}"
                _safe("error dump", lambda: dump.write(None, message))
            raise
        if level >= 3:
            _safe("result logging", lambda: _emit(f"[mate]   result = {_describe(result, level >= 5)}"))
        if dump is not None:
            _safe("output dump", lambda: dump.write(result, None))
        return result

    wrapper.__mate_api__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
