"""mate: sparse-attention and FP8 kernels for LLM inference on Hopper GPUs.

Public modules: :mod:`mate.sparse_mla_interface`, :mod:`mate.msa_interface`,
:mod:`mate.mha_interface` and :mod:`mate.gemm`. CUDA tensors run Triton kernels; CPU
tensors run exact PyTorch references.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
