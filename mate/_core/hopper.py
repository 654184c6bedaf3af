"""Resource limits of a Hopper (sm_90) SM that launch planning and config checks use."""

from __future__ import annotations

import functools

import torch

__all__ = ["SMEM_PER_PROGRAM", "SMEM_PER_SM", "SMEM_RESERVED_PER_PROGRAM", "REGS_PER_SM", "GRID_X_MAX", "GRID_YZ_MAX",
           "smem_for_programs", "cuda_sm_count", "cuda_capability", "planning_sm_count", "tma_aligned"]

SMEM_PER_SM = 228 * 1024
"""Shared memory of one SM (bytes), shared by its resident programs."""

SMEM_RESERVED_PER_PROGRAM = 1024
"""Shared memory the driver reserves for each resident program (bytes)."""

SMEM_PER_PROGRAM = SMEM_PER_SM - SMEM_RESERVED_PER_PROGRAM
"""Dynamic shared memory one program may use (227 KB)."""

REGS_PER_SM = 65536
"""32-bit registers of one SM."""

GRID_X_MAX = 2**31 - 1
"""Most programs along a launch grid's x axis."""

GRID_YZ_MAX = 65535
"""Most programs along a launch grid's y or z axis."""


def smem_for_programs(programs: int) -> int:
    """Dynamic shared memory per program that lets ``programs`` programs share one SM."""
    return SMEM_PER_SM // programs - SMEM_RESERVED_PER_PROGRAM


def tma_aligned(t: torch.Tensor, dims: tuple[int, ...] | None = None) -> bool:
    """Whether a TMA descriptor can view ``t`` in place: unit stride in the last dimension, a
    16-byte aligned address and 16-byte multiples as the byte strides of ``dims`` (default:
    every dimension but the last)."""
    st = t.stride()
    es = t.element_size()
    if st[-1] != 1 or t.data_ptr() % 16:
        return False
    return all(st[i] * es % 16 == 0 for i in (range(len(st) - 1) if dims is None else dims))


@functools.cache
def _cuda_properties(index: int):
    return torch.cuda.get_device_properties(index)


def _index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def cuda_sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (cached: ``torch.cuda.get_device_properties`` costs host time on
    every launch that sizes a persistent grid)."""
    return _cuda_properties(_index(device)).multi_processor_count


def planning_sm_count(device: torch.device, off_gpu: int) -> int:
    """SMs a launch plan fills: the GPU's count for a CUDA device, else ``off_gpu`` (the
    interpreter runs programs one at a time; each planner picks what its CPU tests should
    exercise, e.g. a few virtual SMs so that split plans occur on small shapes)."""
    return cuda_sm_count(device) if device.type == "cuda" else off_gpu


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (cached)."""
    props = _cuda_properties(_index(device))
    return props.major, props.minor
