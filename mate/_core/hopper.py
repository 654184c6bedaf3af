"""Resource limits of a Hopper (sm_90) SM that launch planning and config checks use."""

from __future__ import annotations

__all__ = ["SMEM_PER_PROGRAM", "SMEM_PER_SM", "SMEM_RESERVED_PER_PROGRAM", "REGS_PER_SM", "smem_for_programs"]

SMEM_PER_SM = 228 * 1024
"""Shared memory of one SM (bytes), shared by its resident programs."""

SMEM_RESERVED_PER_PROGRAM = 1024
"""Shared memory the driver reserves for each resident program (bytes)."""

SMEM_PER_PROGRAM = SMEM_PER_SM - SMEM_RESERVED_PER_PROGRAM
"""Dynamic shared memory one program may use (227 KB)."""

REGS_PER_SM = 65536
"""32-bit registers of one SM."""


def smem_for_programs(programs: int) -> int:
    """Dynamic shared memory per program that lets ``programs`` programs share one SM."""
    return SMEM_PER_SM // programs - SMEM_RESERVED_PER_PROGRAM
