"""Helpers shared by mate's tests and benchmarks: numeric comparison, inputs, timing."""

from mate.testing.inputs import poisoned, rand_fp8, randn
from mate.testing.numeric import assert_close, assert_equal, rel_error

__all__ = ["assert_close", "assert_equal", "poisoned", "rand_fp8", "randn", "rel_error"]
