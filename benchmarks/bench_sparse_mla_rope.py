"""Benchmark of ``mla_rope_quantize_fp8`` (sparse-MLA part 1) on the H200.

Shapes: nnz in {1024, 8192} tokens, H in {128, 16} heads, NeoX layout, fp32 cos/sin cache,
outputs written into merged 576-value FP8 rows (the typical use). Peers: the naive
PyTorch implementation (the reference, a chain of elementwise ops). Bytes = inputs read
once (bf16 rows, positions, the cos/sin rows used) + outputs written once (FP8 rows); the
ceiling is the measured copy bandwidth (``copy_GBps``). Extra ``mate BLOCK_H=..`` rows
time other launch configurations of the same kernel, to choose the default.
"""

from __future__ import annotations

import torch

from mate.ops.sparse_mla.reference import mla_rope_quantize_fp8_reference
from mate.sparse_mla_interface import mla_rope_quantize_fp8
from mate.testing.bench import record, rotation_count, time_fn

FAMILY = "sparse_mla"
OP = "mla_rope_quantize_fp8"


def _make_set(nnz: int, H: int, max_seq: int = 8192, device: str = "cuda") -> dict:
    theta = torch.rand(max_seq, 32, device=device) * 6.3
    return {
        "q_rope": torch.randn(nnz, H, 64, device=device, dtype=torch.bfloat16),
        "k_rope": torch.randn(nnz, 64, device=device, dtype=torch.bfloat16),
        "q_nope": torch.randn(nnz, H, 512, device=device, dtype=torch.bfloat16),
        "k_nope": torch.randn(nnz, 512, device=device, dtype=torch.bfloat16),
        "cache": torch.cat([theta.cos(), theta.sin()], dim=1),
        "pos": torch.randint(0, max_seq, (nnz,), device=device, dtype=torch.int64),
        "q_out": torch.empty(nnz, H, 576, device=device, dtype=torch.float8_e4m3fn),
        "kv_out": torch.empty(nnz, 576, device=device, dtype=torch.float8_e4m3fn),
    }


def _bytes(nnz: int, H: int) -> int:
    read = nnz * (H + 1) * 576 * 2 + nnz * 8 + nnz * 64 * 4
    written = nnz * (H + 1) * 576
    return read + written


def _outs(s: dict) -> tuple[torch.Tensor, ...]:
    q, kv = s["q_out"], s["kv_out"]
    return q[..., 512:], kv[:, 512:], q[..., :512], kv[:, :512]


def _mate(s: dict):
    q_rope_out, k_rope_out, q_nope_out, k_nope_out = _outs(s)
    return lambda: mla_rope_quantize_fp8(
        s["q_rope"], s["k_rope"], s["q_nope"], s["k_nope"], s["cache"], s["pos"], quant_scale_q=1.5,
        quant_scale_kv=0.5, q_rope_out=q_rope_out, k_rope_out=k_rope_out, q_nope_out=q_nope_out,
        k_nope_out=k_nope_out)


def _mate_config(s: dict, config: tuple[int, int]):
    from mate.ops.sparse_mla.rope_quant import mla_rope_quantize_fp8_triton

    outs = _outs(s)
    return lambda: mla_rope_quantize_fp8_triton(s["q_rope"], s["k_rope"], s["q_nope"], s["k_nope"], s["cache"],
                                                s["pos"], True, 1.5, 0.5, *outs, config=config)


def _naive(s: dict):
    outs = _outs(s)
    return lambda: mla_rope_quantize_fp8_reference(s["q_rope"], s["k_rope"], s["q_nope"], s["k_nope"], s["cache"],
                                                   s["pos"], True, 1.5, 0.5, *outs)


def run(ceilings: dict, quick: bool = False) -> list[dict]:
    rows: list[dict] = []
    shapes = [(8192, 128), (1024, 128), (8192, 16), (1024, 16)]
    configs = [] if quick else [(16, 4), (8, 2), (4, 4), (16, 8)]
    for nnz, H in shapes:
        nbytes = _bytes(nnz, H)
        sets = [_make_set(nnz, H) for _ in range(rotation_count(nbytes))]
        shape = f"nnz={nnz} H={H}"
        common = dict(family=FAMILY, op=OP, shape=shape, nbytes=nbytes, dtype="bf16->e4m3", ceiling="copy_GBps")
        rows.append(record(ceilings, impl="mate", time_us=time_fn([_mate(s) for s in sets]), **common))
        for cfg in configs:
            try:
                t = time_fn([_mate_config(s, cfg) for s in sets])
                rows.append(record(ceilings, impl=f"mate BLOCK_H={cfg[0]} warps={cfg[1]}", time_us=t, **common))
            except Exception as exc:  # a config that fails to compile is reported, not fatal
                rows.append(record(ceilings, impl=f"mate BLOCK_H={cfg[0]} warps={cfg[1]}", time_us=None,
                                   note=f"{type(exc).__name__}: {exc}"[:200], **common))
        try:
            t = time_fn([_naive(s) for s in sets])
            rows.append(record(ceilings, impl="naive PyTorch", time_us=t, **common))
        except Exception as exc:
            rows.append(record(ceilings, impl="naive PyTorch", time_us=None, note=f"{type(exc).__name__}: {exc}"[:200],
                               **common))
        del sets
        torch.cuda.empty_cache()
    return rows
