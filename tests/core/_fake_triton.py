"""Stand-ins for Triton 3.6's JIT kernel and compiled kernel as ``mate._core.launch`` sees them
(the fast launch and recipe tests run them on CPU tensors)."""

from __future__ import annotations


class FakeCompiled:
    def __init__(self):
        self.function, self.packed_metadata, self.calls = "function", "metadata", []

    def run(self, *args):
        self.calls.append(args)


class FakeJIT:
    """Triton 3.6's JITFunction as the fast path sees it: per-device binders, hooks, [grid]."""

    def __init__(self):
        self.pre_run_hooks = []
        self.slow = []
        self.compiled = []
        self.device_caches = {}

    def binder(self, *args, **kwargs):
        """Positional arguments and tensors given by keyword are runtime arguments (specialized
        as Triton does for ints: 1, a multiple of 16 or neither); other keywords are constexprs."""
        options = {k: v for k, v in kwargs.items() if k == "num_warps"}
        bound = {f"a{i}": a for i, a in enumerate(args)}
        bound.update({k: v for k, v in kwargs.items() if k not in options})
        spec = [("int", "1" if a == 1 else ("D" if a % 16 == 0 else "")) if isinstance(a, int) else ("obj", None)
                for a in args] + [("obj", None) if hasattr(v, "data_ptr") else ("constexpr", v)
                                  for k, v in kwargs.items() if k not in options]
        return bound, spec, options

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.device_caches.setdefault(0, ({}, {}, None, None, self.binder))
            self.slow.append((grid, args, kwargs))
            kernel = FakeCompiled()
            self.compiled.append(kernel)
            return kernel
        return launch
