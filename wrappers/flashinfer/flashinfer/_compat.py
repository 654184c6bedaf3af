"""What the adapters share: the upstream backend names, all of which mean "mate chooses"."""

from __future__ import annotations

from mate._core.checks import check_choice

__all__: list[str] = []

# Backend names that upstream FlashInfer 0.6.17 accepts on the functions this package
# provides. Each selects one of upstream's own libraries; here every one of them means
# "let mate choose" (mate runs its Triton kernels or cuBLAS on CUDA tensors, its PyTorch
# reference on CPU tensors). A name outside this set is a caller error, as upstream.
UPSTREAM_BACKENDS: tuple[str, ...] = (
    "auto",
    "cudnn",
    "cublas",
    "cublaslt",
    "cutlass",
    "trtllm",
    "trtllm-gen",
    "xqa",
    "cute-dsl",
    "cute-dsl-monolithic",
    "cute-dsl-modular",
    "sparse",
    "fa2",
    "fa3",
    "deep_gemm",
    "tgv",
)


def mate_backend(backend: str) -> str:
    """Checks an upstream backend name and returns the one mate is given: always ``"auto"``."""
    check_choice("backend", backend, UPSTREAM_BACKENDS)
    return "auto"
