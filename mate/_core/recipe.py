"""Launch recipes: an eager call's kernel launches, replayed for later calls of the same signature.

Most of an eager call's host time goes to Python whose result depends only on the call's
signature (shapes, strides, dtypes, devices, scalars, the plan): argument checks, part and
tiling arithmetic, workspace slicing and Triton's argument binding. A serving engine repeats
each signature once per layer. A :class:`LaunchRecipe` is built from the launches one call
made through :class:`mate._core.launch.FastLaunch` (compiled kernel, grid, bound arguments):
every tensor argument becomes an address inside one of the call's tensors (that tensor's
index and a byte offset) or a tensor the recipe keeps (a plan's workspace slice). A later
call of the same signature launches the same compiled kernels with its own addresses.

:class:`RecipeCache` trusts a recipe only after a second call of the signature, run the
ordinary way and recorded, launched exactly what the recipe predicts for that call (same
kernels, grids, scalars, and addresses). A per-call temporary among the arguments fails that
test (the recipe keeps the first call's temporary alive, so the second call's one lies
elsewhere), so only calls whose launches are a function of signature and addresses replay.
A replay re-checks what depends on the addresses: each pointer's 16-byte alignment (part of
Triton's specialization), the relative position of tensors that overlapped when recorded
(views of one buffer: which of them an argument belongs to was decided by addresses), and
that the call's outputs overlap none of its other tensors.

Where recipes apply is the caller's decision: paths whose every device operation is a
Triton or Gluon kernel launch through :func:`mate._core.launch.launcher` (a torch operation
or a launch outside it would not be replayed). ``MATE_LAUNCH_RECIPES=0`` at import turns them off.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch._C import _len_torch_dispatch_stack

from mate._core import launch as _launch
from mate._core.checks import _byte_range, check_inputs_enabled

__all__ = ["Identity", "LaunchRecipe", "RecipeCache", "RecipeCall", "RECIPES", "call_key", "disabled",
           "recipes_usable", "recorded", "signature", "tensor_signature"]

RECIPES = os.environ.get("MATE_LAUNCH_RECIPES", "1").strip().lower() not in ("0", "false", "no", "off")
"""Read once at import; ``MATE_LAUNCH_RECIPES=0`` runs every eager call the ordinary way."""

_AMBIGUOUS = -1

_PLAIN = frozenset({type(None), bool, int, float, str, torch.dtype})


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Runs the calls inside the ordinary way (tests and benchmarks compare the two paths)."""
    global RECIPES
    previous, RECIPES = RECIPES, False
    try:
        yield
    finally:
        RECIPES = previous


def recipes_usable(t: torch.Tensor) -> bool:
    """Whether a call on ``t``'s device may record or replay a recipe: an eager CUDA call outside
    tracing, dispatch modes and another call's recording, with ``MATE_CHECK_INPUTS`` off (its
    value checks read the inputs on the host, which a replay would skip). (Without the fast
    launch path, under the interpreter or on another backend a call records no launch, so no
    recipe comes of it.)"""
    return (RECIPES and t.is_cuda and _launch.active_recording() is None and not torch.compiler.is_compiling()
            and not _len_torch_dispatch_stack() and not check_inputs_enabled())


def tensor_signature(tensors: Sequence[torch.Tensor | None]) -> tuple | None:
    """:func:`signature` of a list of tensors (``None`` entries allowed), the cheap way; ``None``
    when an entry is neither."""
    sig = []
    for t in tensors:
        if t is None:
            sig.append(None)
        elif isinstance(t, torch.Tensor):
            sig.append((t.shape, t.stride(), t.dtype, t.get_device()))  # the device index (-1: CPU)
        else:
            return None
    return tuple(sig)


def signature(value: Any) -> Any:
    """A hashable description of one call argument for a recipe key: a tensor's shape, strides,
    dtype and device; plain scalars and dtypes with their type (``True`` and ``1`` differ); tuples, lists
    and dataclass-like objects field by field. ``TypeError`` for anything else."""
    kind = type(value)
    if kind in _PLAIN:  # most arguments: one set lookup
        return (kind, value)
    if isinstance(value, torch.Tensor):
        return (value.shape, value.stride(), value.dtype, value.device)
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(signature(v) for v in value))
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return (type(value), tuple(signature(getattr(value, f)) for f in fields))
    raise TypeError(f"no recipe signature for a {type(value).__name__}")


def call_key(tensors: Sequence[torch.Tensor | None], others: Iterable[Any], *settings: Any) -> tuple | None:
    """A call's recipe key: its ``tensors``' :func:`tensor_signature`, the :func:`signature` of its
    ``others`` (its other arguments, in a fixed order or as (name, value) pairs), the current
    device, ``MATE_BACKEND`` (read per call) and ``settings`` (module settings that shape the
    launches). None when an argument has no signature (the call runs the ordinary way)."""
    sig = tensor_signature(tensors)
    if sig is None:
        return None
    try:
        values = tuple(signature(v) for v in others)
    except TypeError:
        return None
    return (sig, values, torch._C._cuda_getDevice(), os.environ.get("MATE_BACKEND"), *settings)


class Identity:
    """A key part that is one particular object (equal only to itself; keeps it alive, so its
    ``id`` cannot be reused while the key exists)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.obj is self.obj


class _Address:
    """A device address where Triton's launcher wants an object with ``data_ptr()``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _DescriptorAt:
    """A host tensor descriptor (the attributes Triton's launcher reads) at another base; made
    from a recorded descriptor without keeping its tensor."""

    __slots__ = ("base", "shape", "strides", "block_shape", "padding")

    def __init__(self, desc: Any, ptr: int) -> None:
        self.base = _Address(ptr)  # the lists are shared with ``desc``: the launcher only reads them
        self.shape, self.strides, self.block_shape = desc.shape, desc.strides, desc.block_shape
        self.padding = desc.padding


def _is_descriptor(v: Any) -> bool:
    return hasattr(v, "block_shape") and isinstance(getattr(v, "base", None), (torch.Tensor, _Address))


def _address(v: Any) -> int:
    return v if isinstance(v, int) else v.data_ptr()


def _same_argument(predicted: Any, recorded: Any) -> bool:
    """Whether a predicted launch argument means to the kernel what a recorded one did: the
    same address (a recipe passes addresses as ints), descriptor layout or value."""
    if isinstance(recorded, torch.Tensor):
        return isinstance(predicted, (int, torch.Tensor)) and _address(predicted) == recorded.data_ptr()
    if _is_descriptor(recorded):
        return _is_descriptor(predicted) and all(
            (a.data_ptr() if k == "base" else tuple(a) if k != "padding" else a)
            == (b.data_ptr() if k == "base" else tuple(b) if k != "padding" else b)
            for k in ("base", "shape", "strides", "block_shape", "padding")
            for a, b in [(getattr(predicted, k), getattr(recorded, k))])
    return type(predicted) is type(recorded) and predicted == recorded


class LaunchRecipe:
    """The launches of one recorded call, replayable with another call's tensors.

    ``tensors`` are the call's tensors in the order its key lists them (``None`` for absent
    ones). Build with :meth:`build`; ``None`` when an argument's address cannot be attributed
    to exactly one of them."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, tuple[int, int, int], list, list]] = []
        self.checks: list[tuple[int, int, bool]] = []  # (tensor, byte offset, 16-byte aligned)
        # (i, j, ptr_j - ptr_i) of tensors whose extents overlapped when recorded: which of them an
        # address belongs to holds only while they still lie so
        self.relations: list[tuple[int, int, int]] = []
        self.kept: list[torch.Tensor] = []  # argument tensors outside the call's tensors
        self.extents: list[tuple[int, int] | None] = []  # each tensor's byte extent from its address
        self.device = -1

    @classmethod
    def build(cls, recording: _launch.Recording, tensors: Sequence[torch.Tensor | None]) -> LaunchRecipe | None:
        if not recording.complete or not recording.launches:
            return None
        spans = [_byte_range(t) if t is not None and t.numel() else None for t in tensors]
        ptrs = [t.data_ptr() if t is not None else 0 for t in tensors]
        recipe = cls()
        recipe.device = recording.device
        recipe.extents = [None if s is None else (s[0] - p, s[1] - p) for s, p in zip(spans, ptrs)]
        recipe.relations = [(i, j, ptrs[j] - ptrs[i]) for i, a in enumerate(spans) for j, b in enumerate(spans)
                            if i < j and a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]]
        for kernel, grid, values in recording.launches:
            vals, slots = list(values), []
            for pos, v in enumerate(vals):
                if isinstance(v, torch.Tensor):
                    addr, desc = v.data_ptr(), None
                elif _is_descriptor(v):
                    addr, desc = v.base.data_ptr(), v
                else:
                    continue
                owner = cls._owner(addr, spans, ptrs)
                if owner == _AMBIGUOUS:
                    return None
                if owner is None:  # not in the call's tensors: kept (a workspace slice)
                    recipe.kept.append(v.base if desc is not None else v)
                    if desc is None:
                        vals[pos] = addr
                    continue
                if desc is not None:  # a template that keeps none of the recorded call's tensors
                    desc = _DescriptorAt(desc, 0)
                    desc.shape, desc.strides, desc.block_shape = (list(desc.shape), list(desc.strides),
                                                                  list(desc.block_shape))
                slots.append((pos, owner, addr - ptrs[owner], desc))
                recipe.checks.append((owner, addr - ptrs[owner], addr % 16 == 0))
                vals[pos] = None  # filled per replay; the recorded call's tensor is not kept
            recipe.launches.append((kernel, grid, vals, slots))
        return recipe

    @staticmethod
    def _owner(addr: int, spans: list, ptrs: list[int]) -> int | None:
        """Index of the call tensor that holds ``addr`` (None: none does; ``_AMBIGUOUS``: several
        that do not start at one address)."""
        inside = [i for i, s in enumerate(spans) if s is not None and s[0] <= addr <= s[1]]
        if len(inside) <= 1:
            return inside[0] if inside else None
        exact = [i for i in inside if ptrs[i] == addr]
        if not exact:  # inside several tensors: attributable only where they all start at one address
            exact = inside if all(ptrs[i] == ptrs[inside[0]] for i in inside) else []
        if not exact:
            return _AMBIGUOUS
        return exact[0]  # several names for the same memory: the relations keep it so

    def _values(self, ptrs: list[int]) -> list[list]:
        out = []
        for _, _, vals, slots in self.launches:
            if slots:
                vals = vals.copy()
                for pos, i, off, desc in slots:
                    vals[pos] = ptrs[i] + off if desc is None else _DescriptorAt(desc, ptrs[i] + off)
            out.append(vals)
        return out

    def _addresses_hold(self, ptrs: list[int]) -> bool:
        for i, j, delta in self.relations:
            if ptrs[j] - ptrs[i] != delta:
                return False
        for i, off, aligned in self.checks:  # noqa: SIM110 - a loop: no generator on every replay
            if ((ptrs[i] + off) % 16 == 0) != aligned:
                return False
        return True

    def predicts(self, recording: _launch.Recording, tensors: Sequence[torch.Tensor | None]) -> bool:
        """Whether ``recording`` (another call's, made the ordinary way) launched exactly what this
        recipe would have launched for that call's ``tensors``."""
        if not recording.complete or len(recording.launches) != len(self.launches):
            return False
        if recording.device != self.device:
            return False
        ptrs = [t.data_ptr() if t is not None else 0 for t in tensors]
        if not self._addresses_hold(ptrs):
            return False
        for (kernel, grid, _, _), vals, (r_kernel, r_grid, r_vals) in zip(self.launches, self._values(ptrs),
                                                                           recording.launches):
            if kernel is not r_kernel or grid != r_grid or len(vals) != len(r_vals):
                return False
            if not all(_same_argument(a, b) for a, b in zip(vals, r_vals)):
                return False
        return True

    def _disjoint(self, ptrs: list[int], outputs: Sequence[int], outputs_may_share: bool) -> bool:
        """Whether each of the ``outputs`` (indices) shares no byte with any other tensor (with
        ``outputs_may_share``: with any tensor that is not an output)."""
        ext = self.extents
        for o in outputs:
            if ext[o] is None:
                continue
            lo, hi = ptrs[o] + ext[o][0], ptrs[o] + ext[o][1]
            for i, e in enumerate(ext):
                if (i != o and e is not None and lo <= ptrs[i] + e[1] and ptrs[i] + e[0] <= hi
                        and not (outputs_may_share and i in outputs)):
                    return False
        return True

    def replay(self, tensors: Sequence[torch.Tensor | None], outputs: Sequence[int] = (),
               outputs_may_share: bool = False) -> bool:
        """Launches the recipe with ``tensors``' addresses; ``False`` (nothing launched) when the
        addresses break what the recorded kernels were specialized for, one of the ``outputs``
        (indices into ``tensors``) overlaps another tensor (another output too, unless
        ``outputs_may_share``: views of one merged buffer), or launch hooks or Triton's debug mode
        want the ordinary path."""
        ptrs = [t.data_ptr() if t is not None else 0 for t in tensors]
        if (not self._addresses_hold(ptrs) or not self._disjoint(ptrs, outputs, outputs_may_share)
                or not _launch.plain_launches()):
            return False
        device = torch.cuda.current_device()
        if device != self.device:
            return False
        stream = torch._C._cuda_getCurrentRawStream(device)
        for (kernel, grid, _, _), vals in zip(self.launches, self._values(ptrs)):
            kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                       *vals)
        return True


class RecipeCache:
    """Recipes by call key (see the module docstring), the ``limit`` most recently used.

    ``replay(key, tensors)`` runs a trusted recipe; when it returns ``False`` the caller runs
    the call the ordinary way inside :func:`mate._core.launch.recording` (if ``wants(key)``)
    and then calls ``observe(key, recording, tensors)``. A key whose recordings disagree with
    their recipe ``MISSES`` times is not recorded again."""

    MISSES = 3

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._entries: OrderedDict[Any, list] = OrderedDict()  # key -> [recipe or None, trusted, misses]
        self.replays = 0

    def __len__(self) -> int:
        return len(self._entries)

    def trusted(self, key: Any) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry[1]

    def wants(self, key: Any) -> bool:
        """Whether an ordinary call of ``key`` should be recorded."""
        entry = self._entries.get(key)
        return entry is None or entry[2] < self.MISSES

    def replay(self, key: Any, tensors: Sequence[torch.Tensor | None], outputs: Sequence[int] = (),
               outputs_may_share: bool = False) -> bool:
        entry = self._entries.get(key)
        if entry is None or not entry[1] or not entry[0].replay(tensors, outputs, outputs_may_share):
            return False
        self.replays += 1
        with contextlib.suppress(KeyError):  # another thread may have evicted it meanwhile
            self._entries.move_to_end(key)
        return True

    def observe(self, key: Any, recording: _launch.Recording, tensors: Sequence[torch.Tensor | None]) -> None:
        if not recording.complete:  # a first launch (compilation) or a hook: says nothing of the signature
            return
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.limit:
                self._entries.popitem(last=False)  # the least recently used
            entry = self._entries[key] = [None, False, 0]
        self._entries.move_to_end(key)
        if entry[0] is not None and entry[0].predicts(recording, tensors):
            entry[1] = True
            return
        if entry[1]:  # a trusted recipe that declined these addresses (another alignment): kept
            return
        if entry[0] is not None:
            entry[2] += 1
        entry[0] = LaunchRecipe.build(recording, tensors)
        if entry[0] is None:
            entry[2] = self.MISSES


class RecipeCall:
    """One eager call's use of a :class:`RecipeCache`: ``replay()`` its trusted recipe, else run
    the launches of the ordinary path inside ``recorded()``. ``tensors`` are the call's tensors
    in key order with its outputs (at ``outputs``) already allocated; ``outputs_may_share``: the
    outputs may overlap each other (the ordinary path checks them against the inputs only)."""

    def __init__(self, cache: RecipeCache, key: Any, tensors: list, outputs: Sequence[int],
                 outputs_may_share: bool = False) -> None:
        self.cache, self.key, self.tensors, self.outputs = cache, key, tensors, outputs
        self.outputs_may_share = outputs_may_share

    def replay(self) -> bool:
        return self.cache.replay(self.key, self.tensors, self.outputs, self.outputs_may_share)

    @contextlib.contextmanager
    def recorded(self) -> Iterator[None]:
        """Records the launches made inside (when the cache still wants this key) and hands them
        to the cache on a normal exit (a call that raised records nothing)."""
        if not self.cache.wants(self.key):
            yield
            return
        with _launch.recording() as rec:
            yield
        self.cache.observe(self.key, rec, self.tensors)


def recorded(call: RecipeCall | None) -> contextlib.AbstractContextManager:
    """``call.recorded()``, or a context that does nothing for a call without a recipe (the
    entry points run their ordinary launches inside it either way)."""
    return call.recorded() if call is not None else contextlib.nullcontext()
