"""The validation helpers of ``mate._core.checks``: exception types and messages that name
the argument, what was expected and what was given."""

from __future__ import annotations

import re

import pytest
import torch

from mate._core import checks
from mate._core.checks import (
    check_choice,
    check_contiguous,
    check_default,
    check_dtype,
    check_inputs_enabled,
    check_last_dim_contiguous,
    check_ndim,
    check_out_tensor,
    check_positive_int,
    check_python_float,
    check_same_device,
    check_shape,
    check_tensor,
    check_value,
    device_matches,
    fmt_dtypes,
    launch_fits,
)


def _raises(exc: type[Exception], *parts: str):
    """pytest.raises matching every part of the message, in order."""
    return pytest.raises(exc, match=".*".join(re.escape(p) for p in parts))


def test_every_exported_helper_is_tested():
    tested = {
        "check_tensor", "check_dtype", "check_shape", "check_ndim", "check_contiguous",
        "check_last_dim_contiguous", "check_same_device", "check_out_tensor", "check_value",
        "check_choice", "check_positive_int", "check_python_float", "check_default",
        "check_inputs_enabled", "fmt_dtypes", "check_is_tensor", "device_matches", "launch_fits",
        "check_defaults", "check_tma_aligned", "check_no_overlap", "byte_ranges", "ByteRange",
    }
    assert set(checks.__all__) <= tested, set(checks.__all__) - tested


def test_check_is_tensor():
    with _raises(TypeError, "query must be a torch.Tensor, got list"):
        checks.check_is_tensor("query", [1.0])
    with _raises(TypeError, "query must be a torch.Tensor, got NoneType"):
        check_tensor("query", None)


def test_fmt_dtypes():
    assert fmt_dtypes([torch.bfloat16]) == "torch.bfloat16"
    assert fmt_dtypes([torch.bfloat16, torch.float16]) == "one of (torch.bfloat16, torch.float16)"


def test_check_dtype():
    x = torch.zeros(2, dtype=torch.bfloat16)
    check_dtype("query", x, torch.bfloat16)
    check_dtype("query", x, (torch.float16, torch.bfloat16))
    with _raises(TypeError, "query must be torch.float8_e4m3fn, got torch.bfloat16"):
        check_dtype("query", x, torch.float8_e4m3fn)
    with _raises(TypeError, "kv must be one of (torch.float16, torch.float32), got torch.bfloat16"):
        check_dtype("kv", x, [torch.float16, torch.float32])
    with _raises(TypeError, "kv must be a torch.Tensor, got float"):
        check_dtype("kv", 1.0, torch.float32)


def test_check_ndim():
    x = torch.zeros(2, 3)
    check_ndim("a", x, 2)
    check_ndim("a", x, (2, 3))
    with _raises(ValueError, "a must be 3-D, got 2-D with shape (2, 3)"):
        check_ndim("a", x, 3)
    with _raises(ValueError, "a must be 3-D or 4-D, got 2-D"):
        check_ndim("a", x, [3, 4])


def test_check_shape():
    x = torch.zeros(2, 3, 4)
    check_shape("kv", x, (2, None, 4))
    check_shape("kv", torch.zeros(0, 3), (0, 3))
    with _raises(ValueError, "kv must have shape [2, *, 5], got [2, 3, 4]"):
        check_shape("kv", x, (2, None, 5))
    with _raises(ValueError, "kv must have shape [2, 3], got [2, 3, 4]"):
        check_shape("kv", x, (2, 3))


def test_check_contiguous():
    x = torch.zeros(4, 6)
    check_contiguous("out", x)
    with _raises(ValueError, "out must be contiguous, got shape [6, 4] with strides [1, 6]"):
        check_contiguous("out", x.t())


def test_check_last_dim_contiguous():
    x = torch.zeros(4, 6)
    check_last_dim_contiguous("q", x[:, :3])  # a row slice keeps stride 1
    check_last_dim_contiguous("q", x[:, ::6])  # size-1 last dim (stride 6): any stride
    check_last_dim_contiguous("q", torch.zeros(()))
    with _raises(ValueError, "q must have a contiguous last dimension (stride 1), got strides [1, 6]"):
        check_last_dim_contiguous("q", x.t())


def test_check_same_device():
    a, b = torch.zeros(1), torch.zeros(1)
    assert check_same_device(a=a, b=b, c=None) == torch.device("cpu")
    with _raises(ValueError, "at least one tensor argument is required"):
        check_same_device(a=None)
    meta = torch.zeros(1, device="meta")
    with _raises(ValueError, "b must be on cpu (the device of a), got meta"):
        check_same_device(a=a, b=meta)
    with _raises(TypeError, "out must be a torch.Tensor, got list"):  # before any device is read
        check_same_device(a=a, out=[1, 2])


def test_device_matches():
    cuda0, cuda1, cpu = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
    assert device_matches(cuda0, "cuda") and device_matches(cuda1, torch.device("cuda"))
    assert device_matches(cuda0, "cuda:0") and not device_matches(cuda1, "cuda:0")
    assert device_matches(cpu, "cpu") and not device_matches(cpu, "cuda") and not device_matches(cuda0, "cpu")


def test_check_tensor_order_and_options():
    x = torch.zeros(4, 8, dtype=torch.float16)
    assert check_tensor("x", x, dtype=torch.float16, shape=(4, 8), ndim=2, contiguous=True,
                        last_dim_contiguous=True, device=torch.device("cpu")) is x
    # the dtype is checked before the shape
    with _raises(TypeError, "x must be torch.float32, got torch.float16"):
        check_tensor("x", x, dtype=torch.float32, shape=(1,))
    with _raises(ValueError, "x must be 3-D, got 2-D"):
        check_tensor("x", x, ndim=3, shape=(4, 8, 1))
    with _raises(ValueError, "x must have shape [4, 9], got [4, 8]"):
        check_tensor("x", x, shape=(4, 9))
    with _raises(ValueError, "x must be on meta, got cpu"):
        check_tensor("x", x, device="meta")
    with _raises(ValueError, "x must be contiguous"):
        check_tensor("x", x.t(), contiguous=True)
    with _raises(ValueError, "x must have a contiguous last dimension"):
        check_tensor("x", x.t(), last_dim_contiguous=True)


def test_check_out_tensor():
    out = torch.empty(3, 5, dtype=torch.bfloat16)
    dev = torch.device("cpu")
    assert check_out_tensor("out", out, shape=(3, 5), dtype=torch.bfloat16, device=dev) is out
    with _raises(ValueError, "out must have shape [3, 6], got [3, 5]"):
        check_out_tensor("out", out, shape=(3, 6), dtype=torch.bfloat16, device=dev)
    with _raises(TypeError, "out must be torch.float32, got torch.bfloat16"):
        check_out_tensor("out", out, shape=(3, 5), dtype=torch.float32, device=dev)
    with _raises(ValueError, "out must be on meta, got cpu"):
        check_out_tensor("out", out, shape=(3, 5), dtype=torch.bfloat16, device=torch.device("meta"))
    # contiguous by default; strided outputs are allowed when the op says so
    strided = torch.empty(3, 8, dtype=torch.bfloat16)[:, :5]
    with _raises(ValueError, "out must be contiguous"):
        check_out_tensor("out", strided, shape=(3, 5), dtype=torch.bfloat16, device=dev)
    check_out_tensor("out", strided, shape=(3, 5), dtype=torch.bfloat16, device=dev, contiguous=False,
                     last_dim_contiguous=True)
    with _raises(ValueError, "out must have a contiguous last dimension"):
        check_out_tensor("out", strided.t(), shape=(5, 3), dtype=torch.bfloat16, device=dev, contiguous=False,
                         last_dim_contiguous=True)
    # a strided buffer must not overlap itself (an expanded view: every row the same memory)
    for view in (torch.empty(1, 5, dtype=torch.bfloat16).expand(3, 5),
                 torch.empty(3, 1, 5, dtype=torch.bfloat16).expand(3, 2, 5)):
        with _raises(ValueError, "out must not overlap itself", f"got strides {tuple(view.stride())}"):
            check_out_tensor("out", view, shape=tuple(view.shape), dtype=torch.bfloat16, device=dev,
                             contiguous=False, last_dim_contiguous=True)
    check_out_tensor("out", torch.empty(4, 3, dtype=torch.bfloat16).t(), shape=(3, 4), dtype=torch.bfloat16,
                     device=dev, contiguous=False)  # a transposed view does not overlap
    check_out_tensor("out", torch.empty(0, 5, dtype=torch.bfloat16).expand(0, 5), shape=(0, 5),
                     dtype=torch.bfloat16, device=dev, contiguous=False)


def test_check_value():
    check_value("topk", True, "a positive multiple of 64", 128)
    with _raises(ValueError, "topk must be a positive multiple of 64, got 100"):
        check_value("topk", False, "a positive multiple of 64", 100)
    with _raises(ValueError, "layout must be 'NHD', got 'HND'"):
        check_value("layout", False, "'NHD'", "HND")


def test_check_choice():
    check_choice("backend", "auto", ("auto", "triton"))
    with _raises(ValueError, "backend must be one of ('auto', 'triton'), got 'cuda'"):
        check_choice("backend", "cuda", iter(["auto", "triton"]))


def test_check_positive_int():
    assert check_positive_int("block", 64, multiple_of=64) == 64
    with _raises(TypeError, "block must be an int, got float"):
        check_positive_int("block", 64.0)
    with _raises(TypeError, "block must be an int, got bool"):
        check_positive_int("block", True)
    with _raises(ValueError, "block must be a positive int, got 0"):
        check_positive_int("block", 0)
    with _raises(ValueError, "block must be a positive int, got -3"):
        check_positive_int("block", -3)
    with _raises(ValueError, "block must be a positive multiple of 64, got 96"):
        check_positive_int("block", 96, multiple_of=64)


def test_check_python_float():
    assert check_python_float("scale", 2) == 2.0 and isinstance(check_python_float("scale", 2), float)
    assert check_python_float("scale", 0.5) == 0.5
    with _raises(NotImplementedError, "scale must be a Python float; tensor-valued scale is not implemented"):
        check_python_float("scale", torch.tensor(1.0))
    with _raises(TypeError, "scale must be a float, got str"):
        check_python_float("scale", "1.0")
    with _raises(TypeError, "scale must be a float, got bool"):
        check_python_float("scale", False)


def test_check_default():
    check_default("causal", False, False)
    check_default("window", None, None)
    check_default("softcap", 0.0, 0.0)
    with _raises(NotImplementedError, "causal=True is not implemented (only the default False is supported)"):
        check_default("causal", True, False)
    with _raises(NotImplementedError, "window=128 is not implemented (only the default None is supported)"):
        check_default("window", 128, None)
    # identity for None and bools: 0 is not the default False
    with _raises(NotImplementedError, "causal=0 is not implemented"):
        check_default("causal", 0, False)
    with _raises(NotImplementedError, "softcap=30.0 is not implemented (only the default 0.0"):
        check_default("softcap", 30.0, 0.0)
    # a tensor is never taken for a plain default (and never asked for its truth value)
    with _raises(NotImplementedError, "softcap=tensor([0., 0.]) is not implemented"):
        check_default("softcap", torch.zeros(2), 0.0)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(None, False), ("0", False), ("", False), ("1", True), ("true", True), (" ON ", True), ("no", False)],
)
def test_check_inputs_enabled(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("MATE_CHECK_INPUTS", raising=False)
    else:
        monkeypatch.setenv("MATE_CHECK_INPUTS", value)
    assert check_inputs_enabled() is enabled


def test_launch_fits():
    """Triton's out-of-resources error inside the block becomes a ValueError naming the kernel,
    its options and the amounts; other errors and a clean block pass through unchanged."""
    from triton.runtime.errors import OutOfResources

    with launch_fits("the demo kernel", block_n=64, num_stages=3):
        pass
    with _raises(ValueError, "the demo kernel with block_n=64, num_stages=3 needs 253952 of shared memory",
                 "the GPU has 232448"), launch_fits("the demo kernel", block_n=64, num_stages=3):
        raise OutOfResources(253952, 232448, "shared memory")
    with pytest.raises(RuntimeError, match="other"), launch_fits("the demo kernel", block_n=64):
        raise RuntimeError("other")


def test_check_defaults():
    from mate._core.checks import check_defaults

    check_defaults({"qv": (None, None), "softcap": (float("0"), 0.0), "cp_rank": (0, 0), "causal": (False, False)})
    with _raises(NotImplementedError, "softcap=30.0 is not implemented (only the default 0.0"):
        check_defaults({"qv": (None, None), "softcap": (30.0, 0.0), "cp_rank": (1, 0)})  # the first one named
    with _raises(NotImplementedError, "qv=tensor([0.]) is not implemented"):
        check_defaults({"qv": (torch.zeros(1), None)})
    with _raises(NotImplementedError, "causal=0 is not implemented"):
        check_defaults({"causal": (0, False)})


def test_check_no_overlap():
    from mate._core.checks import check_no_overlap

    buf = torch.zeros(4, 8)
    check_no_overlap("out", buf[:2], a=buf[2:], b=None, c=torch.zeros(3))  # disjoint rows, None, other storage
    with pytest.raises(ValueError, match="out must not overlap a"):
        check_no_overlap("out", buf[1:3], a=buf[2:])
    with pytest.raises(ValueError, match="out must not overlap b"):
        check_no_overlap("out", buf.t(), b=buf[3, 7:])  # a transposed view covers the same bytes
    check_no_overlap("out", buf[:0], a=buf)  # empty: nothing written
    # contiguous tensors take the short path: [data_ptr, data_ptr + numel * element_size)
    flat = torch.zeros(64)
    check_no_overlap("out", flat[8:16], a=flat[:8], b=flat[16:])  # adjacent on both sides
    with pytest.raises(ValueError, match="out must not overlap a"):
        check_no_overlap("out", flat[8:16], a=flat[15:20])  # one shared element
    with pytest.raises(ValueError, match="out must not overlap a"):
        check_no_overlap("out", flat[8:16], a=flat[:9])
    # a strided input between out's elements overlaps out's extent: conservative, refused
    with pytest.raises(ValueError, match="out must not overlap a"):
        check_no_overlap("out", flat[0:16:2], a=flat[1:2])
    # a strided out against a contiguous input past its last element
    check_no_overlap("out", flat[0:16:2], a=flat[15:])


def test_byte_ranges_in_place_of_inputs():
    """Extents computed once serve several outputs' checks, as the tensors would."""
    from mate._core.checks import ByteRange, byte_ranges, check_no_overlap

    buf = torch.zeros(4, 8)
    reads = byte_ranges(a=buf[2:], b=None, c=torch.zeros(0), d=torch.zeros(3))
    assert set(reads) == {"a", "d"} and isinstance(reads["a"], ByteRange)
    base = buf.data_ptr()
    assert reads["a"] == ByteRange(base + 64, base + 127, buf.device)
    check_no_overlap("out", buf[:2], **reads)
    with pytest.raises(ValueError, match="lse must not overlap a"):
        check_no_overlap("lse", buf[1:3], **reads)


def test_public_apis_reject_an_out_that_aliases_an_input():
    from mate.gemm import bmm_bf16
    from mate.mha_interface import flash_attn_varlen_func

    a = torch.randn(2, 16, 32).to(torch.bfloat16)
    b = torch.randn(2, 32, 16).to(torch.bfloat16)
    with pytest.raises(ValueError, match="out must not overlap A"):
        bmm_bf16(a, b, out=a[:, :, :16])
    q = torch.randn(4, 2, 64).to(torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not overlap q"):
        flash_attn_varlen_func(q, q[:, :1], q[:, :1], cu, cu, 4, 4, out=q)
    # the index tensors the kernels read count as inputs too
    out = torch.empty(4, 2, 64, dtype=torch.bfloat16)
    cu_in_out = out.view(-1).view(torch.int32)[:2]
    cu_in_out.copy_(cu)
    with pytest.raises(ValueError, match="out must not overlap cu_seqlens_q"):
        flash_attn_varlen_func(q, q[:, :1], q[:, :1], cu_in_out, cu, 4, 4, out=out)
    from mate.sparse_mla_interface import sparse_mla_fp8_decode

    query = torch.randn(1, 1, 16, 576).to(torch.float8_e4m3fn)
    kv = torch.randn(2, 64, 576).to(torch.float8_e4m3fn)
    out = torch.empty(1, 1, 16, 512, dtype=torch.bfloat16)
    idx = out.view(-1).view(torch.int32)[:64].view(1, 1, 64)
    with pytest.raises(ValueError, match="out must not overlap block_tables"):
        sparse_mla_fp8_decode(query, kv, None, 128, 512, 64, idx, torch.tensor([64], dtype=torch.int32), 128,
                              sparse_mla_top_k=64, out=out)


def test_check_int32():
    from mate._core.checks import check_int32

    check_int32("n", 2**31 - 1)
    check_int32("t", torch.tensor([-(2**31), 5], dtype=torch.int64))
    check_int32("t", torch.zeros(0, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"n must be an int32 value, got 2147483648"):
        check_int32("n", 2**31)
    with pytest.raises(ValueError, match=r"t must be int32 page ids, got 'values in \[-2147483649, 0\]'"):
        check_int32("t", torch.tensor([-(2**31) - 1, 0]), "int32 page ids")


def test_tma_aligned_needs_aligned_address_strides_and_unit_last_stride():
    from mate._core.hopper import tma_aligned

    cache = torch.zeros(6, 128, 4, 128, dtype=torch.bfloat16)
    assert tma_aligned(cache)
    assert tma_aligned(cache[::2])  # every other page: strided, still aligned
    assert not tma_aligned(cache.view(-1)[1:1 + 5 * 128 * 4 * 128].view(5, 128, 4, 128))  # 2 bytes off
    odd = torch.zeros(4, 128, 4, 132, dtype=torch.bfloat16)[..., :128]  # row stride 264 bytes
    assert not tma_aligned(odd)
    assert tma_aligned(odd, dims=(0,))  # only the page stride asked for
    assert not tma_aligned(cache.transpose(2, 3))  # last dimension not unit-stride
    fp8 = torch.zeros(2, 128, 1, 144, dtype=torch.uint8)[..., :128]  # 144-byte rows: aligned
    assert tma_aligned(fp8)


def test_check_tma_aligned_names_the_tensor_address_and_strides():
    cache = torch.zeros(3, 128, 2, 128, dtype=torch.bfloat16)
    checks.check_tma_aligned("k", cache)
    shifted = cache.view(-1)[1:1 + 2 * 128 * 2 * 128].view(2, 128, 2, 128)
    with _raises(ValueError, "k (address and strides) must be 16-byte aligned, got 'data_ptr % 16 = 2, strides",
                 "[32768, 256, 128, 1]"):
        checks.check_tma_aligned("k", shifted)
