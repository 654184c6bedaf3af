"""CUDA-graph capture for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["capture_graph"]


def capture_graph(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """Runs ``fn`` once on a side stream (Triton compiles, lazy buffers get allocated),
    then captures one call of it in a CUDA graph and returns the graph (not replayed)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
