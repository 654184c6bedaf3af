"""mate: sparse-attention and FP8 kernels for LLM inference on Hopper GPUs.

Public modules: :mod:`mate.sparse_mla_interface`, :mod:`mate.msa_interface`,
:mod:`mate.mha_interface` and :mod:`mate.gemm`. CUDA tensors run Triton kernels; CPU
tensors run exact PyTorch references. ``import mate`` alone stays light: each public module
is imported on first access as an attribute (``mate.gemm.bmm_fp8``).
"""

import importlib

__version__ = "0.1.0"

_PUBLIC_MODULES = ("sparse_mla_interface", "msa_interface", "mha_interface", "gemm", "api_logging")

__all__ = ["__version__", *_PUBLIC_MODULES]


def __getattr__(name: str):
    if name in _PUBLIC_MODULES:
        return importlib.import_module(f"mate.{name}")
    raise AttributeError(f"module 'mate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC_MODULES))
