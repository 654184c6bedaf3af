"""FlashInfer-compatible names running on mate (distribution ``flashinfer-python``, ``0.6.17+mate``).

Installing this package replaces an upstream FlashInfer in the environment. It provides
only ``flashinfer.bmm_bf16`` / ``flashinfer.bmm_fp8`` here, and
:mod:`flashinfer.gemm`, :mod:`flashinfer.rope` and :mod:`flashinfer.decode`; every
function is a thin adapter onto :mod:`mate`.
"""

from flashinfer import decode, gemm, rope  # noqa: F401  (attributes of the package, as upstream)
from flashinfer.gemm import bmm_bf16, bmm_fp8

__version__ = "0.6.17+mate"

__all__ = ["bmm_bf16", "bmm_fp8"]
