"""Registration of flat private ops with ``mate_custom_op``: eager calls, torch.compile on
the CPU and ``torch.library.opcheck``."""

from __future__ import annotations

import torch

from mate._core.custom_op import LIBRARY_NAMESPACE, mate_custom_op
from mate.testing import assert_close, assert_equal, poisoned


# A mutating op in the shape every public op uses: the public function allocates the
# outputs, the flat op writes into them and returns nothing (no fake needed).
@mate_custom_op("core_test_scale_add", mutates_args=("out", "amax"))
def _scale_add(x: torch.Tensor, y: torch.Tensor, scale: float, out: torch.Tensor, amax: torch.Tensor) -> None:
    res = x.float() * scale + y.float()
    out.copy_(res.to(out.dtype))
    amax.copy_(res.abs().amax(dim=-1))


def scale_add(x: torch.Tensor, y: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(x)
    amax = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    torch.ops.mate.core_test_scale_add(x, y, scale, out, amax)
    return out, amax


# A functional op that returns a fresh tensor: it needs a fake implementation.
def _rowsum_fake(x: torch.Tensor, bias: float) -> torch.Tensor:
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


@mate_custom_op("core_test_rowsum", fake=_rowsum_fake)
def _rowsum(x: torch.Tensor, bias: float) -> torch.Tensor:
    return x.float().sum(dim=-1) + bias


def _ref(x, y, scale):
    res = x.double() * scale + y.double()
    return res, res.abs().amax(dim=-1)


def test_registered_under_the_namespace():
    assert LIBRARY_NAMESPACE == "mate"
    assert hasattr(torch.ops.mate, "core_test_scale_add")
    schema = str(torch.ops.mate.core_test_scale_add.default._schema)
    # the mutated buffers are declared in the schema
    assert "Tensor(a3!) out" in schema and "Tensor(a4!) amax" in schema, schema


def test_eager():
    x = torch.randn(5, 33, dtype=torch.bfloat16)
    y = torch.randn(5, 33, dtype=torch.bfloat16)
    out, amax = scale_add(x, y, 0.75)
    ref, ref_amax = _ref(x, y, 0.75)
    # bf16 output of fp32 math: one bf16 rounding (2**-8 relative) on top of fp32
    assert_close(out, ref.to(torch.bfloat16), atol=1e-2, rtol=8e-3)
    assert_close(amax, ref_amax.float(), atol=1e-5, rtol=1e-5)  # fp32 math vs fp64
    # writes into the given buffers, every element
    buf = poisoned((5, 33), torch.bfloat16)
    amax_buf = poisoned((5,), torch.float32)
    assert _scale_add(x, y, 0.75, buf, amax_buf) is None
    assert_equal(buf, out)
    assert_equal(amax_buf, amax)
    assert_close(_rowsum(x, 1.5), x.double().sum(-1).float() + 1.5, atol=1e-4, rtol=1e-5)


def test_torch_compile():
    torch._dynamo.reset()
    x = torch.randn(4, 64)
    y = torch.randn(4, 64)

    def f(x, y):
        out, amax = scale_add(x, y, 2.0)
        return out * 2, amax, _rowsum(out, 0.5)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = compiled(x, y)
    want = f(x, y)
    for g, w in zip(got, want):
        assert_equal(g, w)  # the same fp32 ops in the same order: bit-identical
    torch._dynamo.reset()


def test_opcheck():
    x = torch.randn(3, 40)
    y = torch.randn(3, 40)
    out = torch.empty(3, 40)
    amax = torch.empty(3)
    torch.library.opcheck(torch.ops.mate.core_test_scale_add.default, (x, y, 0.5, out, amax))
    torch.library.opcheck(torch.ops.mate.core_test_rowsum.default, (x, 0.25))


def _bad_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)  # wrong: the op returns one value per row


@mate_custom_op("core_test_bad_fake", fake=_bad_fake)
def _rowmax(x: torch.Tensor) -> torch.Tensor:
    return x.amax(dim=-1)


def test_opcheck_catches_a_wrong_fake():
    # the opcheck above is not vacuous: a fake with the wrong output shape is reported
    x = torch.randn(3, 8)
    try:
        torch.library.opcheck(torch.ops.mate.core_test_bad_fake.default, (x,))
    except Exception as exc:  # OpCheckError (its module moved between torch versions)
        assert "fake" in str(exc).lower() or "shape" in str(exc).lower(), exc
    else:
        raise AssertionError("opcheck accepted a fake implementation with the wrong shape")


def test_torch_compile_writes_into_views_of_a_merged_buffer():
    # public ops write into strided views of one merged buffer (e.g. nope | rope parts);
    # under torch.compile the mutation must land in the caller's buffer
    torch._dynamo.reset()
    x = torch.randn(4, 64)
    y = torch.randn(4, 64)

    def f(x, y, buf, amax):
        torch.ops.mate.core_test_scale_add(x, y, 3.0, buf[:, 8:72], amax)
        return buf

    buf_eager, amax_eager = poisoned((4, 80), torch.float32), poisoned((4,), torch.float32)
    buf_comp, amax_comp = poisoned((4, 80), torch.float32), poisoned((4,), torch.float32)
    f(x, y, buf_eager, amax_eager)
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x, y, buf_comp, amax_comp)
    assert out.data_ptr() == buf_comp.data_ptr()
    assert_equal(buf_comp, buf_eager)  # NaN outside the view in both (NaN equals NaN)
    assert torch.isnan(buf_comp[:, :8]).all() and torch.isnan(buf_comp[:, 72:]).all()
    assert not torch.isnan(buf_comp[:, 8:72]).any()
    assert_equal(amax_comp, amax_eager)
    torch._dynamo.reset()


# An op whose implementation reads a value on the host: it fails on fake tensors, so it
# shows which path a call took.
def _host_read_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@mate_custom_op("core_test_host_read", fake=_host_read_fake)
def _host_read(x: torch.Tensor) -> torch.Tensor:
    return x * float(x.sum())


def test_eager_calls_skip_the_dispatcher_and_tracing_uses_the_op(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import mate._core.custom_op as co

    x = torch.randn(3, 5)
    want = x * float(x.sum())
    assert isinstance(_host_read, co.MateOp) and _host_read.__name__ == "_host_read"
    # eager: the implementation itself (no autograd / ADInplaceOrView layers), same result;
    # with EAGER_DIRECT off the call goes through the registered op
    registered = _host_read.op
    through_op = []
    monkeypatch.setattr(_host_read, "op", lambda *a: through_op.append(1) or registered(*a))
    assert_equal(_host_read(x), want)
    assert through_op == []
    monkeypatch.setattr(co, "EAGER_DIRECT", False)
    assert_equal(_host_read(x), want)  # through torch.ops.mate.core_test_host_read
    assert through_op == [1]
    monkeypatch.setattr(co, "EAGER_DIRECT", True)
    monkeypatch.setattr(_host_read, "op", registered)
    # under a dispatch mode (fake tensors) the registered op runs its fake implementation;
    # the implementation would have to read a fake value on the host
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        got = _host_read(fx)
        assert got.shape == x.shape
        try:
            _host_read.fn(fx)
        except Exception:
            pass
        else:
            raise AssertionError("the implementation ran on fake tensors: the test op does not tell the paths apart")
    # traced: torch.compile sees the registered op
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: _host_read(t) + 1, backend="aot_eager", fullgraph=True)
    assert_equal(compiled(x), want + 1)
    torch._dynamo.reset()
