"""Tensor-parallel decode step of one DeepSeek-V3.2-shaped sparse-attention layer.

The attention heads are split over the ``world_size`` ranks of ``torch.distributed``
(``gloo`` on CPU, ``nccl`` on GPUs), as DeepSeek-V3.2 is served with its 128 heads over
8 GPUs. Launch with torchrun (started with plain ``python``, it runs as one rank)::

    torchrun --nproc-per-node 2 examples/tp_sparse_mla_decode.py            # CPU, gloo
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 8 examples/tp_sparse_mla_decode.py --deepseek \
        --time --json benchmarks/results/tp_sparse_mla_decode.json          # 8 GPUs, nccl

(``NCCL_NVLS_ENABLE=0`` keeps NVLink multicast off, as the lent multi-GPU machines require.)

One decode step, in MLA's absorbed form, for every rank r holding heads [r*Hr, (r+1)*Hr):

1. ``q = x @ W_q[heads]`` gives each head 128 latent-projected ("nope") + 64 rotary
   values; the nope part is absorbed into the 512-wide latent space with ``W_uk``.
   The new token's latent KV row (512 + 64) comes from ``x @ W_dkv`` (shared by all heads,
   so every rank computes it and writes it into its replica of the paged cache).
2. ``mla_rope_quantize_fp8`` rotates and quantizes the query heads into one merged
   [B, 1, Hr, 576] FP8 tensor and the KV row straight into its cache slot.
3. ``sparse_mla_fp8_decode`` attends each query to the shared top-k index list (the
   indexer's output is the same on every rank).
4. The latent outputs go back through ``W_uv`` and the row-parallel output projection
   ``W_o[:, heads]``; an ``all_reduce`` sums the ranks' partial results.

Rank 0 then runs the same step with all heads in one process and checks that both agree.
Every rank draws the same weights and inputs from one seed and keeps only its slice.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import torch
import torch.distributed as dist

# imported before init_process_group on purpose: its functions bind group.WORLD as default
# arguments at import. Imported later (torch._dynamo pulls it in at the first custom-op call),
# they keep the process group alive past destroy_process_group, and a gloo worker thread still
# running at interpreter shutdown aborts the process when it releases a tensor (SIGABRT,
# "terminate called without an active exception").
import torch.distributed.nn.functional  # noqa: F401

from mate.sparse_mla_interface import get_batch_decode_metadata_mla, mla_rope_quantize_fp8, sparse_mla_fp8_decode
from mate.testing.graphs import capture_graph

NOPE, ROPE, LATENT = 128, 64, 512  # per-head q/k nope dim, rotary dim, kv_lora_rank
V_HEAD = 128


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 4
    heads: int = 8
    hidden: int = 256
    top_k: int = 128
    page_size: int = 64
    context: int = 512  # tokens already cached per request
    seed: int = 0


@dataclasses.dataclass
class Layer:
    """Weights (full, or one rank's head slice) and the shared decode-step inputs."""

    w_q: torch.Tensor  # [Hs, NOPE + ROPE, hidden]
    w_uk: torch.Tensor  # [Hs, NOPE, LATENT]
    w_uv: torch.Tensor  # [Hs, LATENT, V_HEAD]
    w_o: torch.Tensor  # [hidden, Hs, V_HEAD]
    w_dkv: torch.Tensor  # [LATENT + ROPE, hidden] (shared)
    x: torch.Tensor  # [B, hidden] hidden states of the decoded tokens
    kv_cache: torch.Tensor  # [pages, page_size, 576] FP8, this rank's replica
    cos_sin: torch.Tensor  # [max_pos, 64]
    positions: torch.Tensor  # [B] position of the decoded token
    new_rows: torch.Tensor  # [B, 576] strided view of the cache rows the new tokens go to
    block_tables: torch.Tensor  # [B, 1, top_k] shared top-k rows (-1 = none)
    seq_lens: torch.Tensor  # [B]


Q_SCALE, KV_SCALE = 2.0, 4.0  # per-tensor FP8 quantization scales: fp8 = value * scale


def build(cfg: Config, heads: slice, device: torch.device) -> Layer:
    """The layer and step inputs, drawn on the CPU from ``cfg.seed`` (identical on all ranks)."""
    g = torch.Generator().manual_seed(cfg.seed)
    H, D, B = cfg.heads, cfg.hidden, cfg.batch

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    w_q = rnd(H, NOPE + ROPE, D, scale=D**-0.5)
    w_uk = rnd(H, NOPE, LATENT, scale=NOPE**-0.5)
    w_uv = rnd(H, LATENT, V_HEAD, scale=LATENT**-0.5)
    w_o = rnd(D, H, V_HEAD, scale=(H * V_HEAD) ** -0.5)
    w_dkv = rnd(LATENT + ROPE, D, scale=D**-0.5)
    x = rnd(B, D)
    pages_per_req = -(-(cfg.context + 1) // cfg.page_size)
    num_pages = B * pages_per_req
    max_pos = cfg.context + 1
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, dtype=torch.float32) / 32))
    angles = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    # the cached context: latent rows of earlier tokens, already rotated, quantized with KV_SCALE
    rows = rnd(num_pages * cfg.page_size, LATENT + ROPE)
    kv_cache = (rows * KV_SCALE).clamp(-448, 448).to(torch.float8_e4m3fn).view(num_pages, cfg.page_size, 576)
    base = torch.arange(B) * pages_per_req * cfg.page_size
    positions = torch.full((B,), cfg.context, dtype=torch.int64)
    slots = base + cfg.context
    # the indexer's shared top-k: the new token plus top_k - 1 earlier ones, a few slots unused
    picks = torch.stack([torch.randperm(cfg.context, generator=g)[: cfg.top_k - 1] for _ in range(B)])
    block_tables = torch.cat([slots[:, None], picks + base[:, None]], dim=1).to(torch.int32)
    block_tables[:, -3:] = -1
    seq_lens = torch.full((B,), cfg.top_k, dtype=torch.int32)
    seq_lens[-1] = cfg.top_k // 2  # one request with a shorter list

    def dev(t):
        return t.to(device)

    kv_dev = dev(kv_cache)
    per_req = pages_per_req * cfg.page_size  # the new token of request b is row b * per_req + context
    return Layer(
        w_q=dev(w_q[heads]).bfloat16(), w_uk=dev(w_uk[heads]).bfloat16(), w_uv=dev(w_uv[heads]).bfloat16(),
        w_o=dev(w_o[:, heads]).bfloat16(), w_dkv=dev(w_dkv).bfloat16(), x=dev(x).bfloat16(),
        kv_cache=kv_dev, cos_sin=dev(cos_sin), positions=dev(positions),
        new_rows=kv_dev.view(-1, 576)[cfg.context :: per_req],
        block_tables=dev(block_tables.view(B, 1, cfg.top_k)), seq_lens=dev(seq_lens),
    )


class AttentionStep:
    """One decode step on the heads of ``layer``; buffers and decode metadata made once."""

    def __init__(self, layer: Layer, cfg: Config):
        self.layer, self.cfg = layer, cfg
        B, Hs = cfg.batch, layer.w_q.shape[0]
        dev = layer.x.device
        self.query = torch.empty(B, 1, Hs, 576, dtype=torch.float8_e4m3fn, device=dev)
        self.out = torch.empty(B, 1, Hs, LATENT, dtype=torch.bfloat16, device=dev)
        self.metadata = get_batch_decode_metadata_mla(self.query, layer.seq_lens, cfg.top_k)
        softmax_scale = 1.0 / math.sqrt(NOPE + ROPE)
        # scale folding: logits use q * k / (Q_SCALE * KV_SCALE), values v / KV_SCALE
        self.bmm1_scale = softmax_scale / (Q_SCALE * KV_SCALE)
        self.bmm2_scale = 1.0 / KV_SCALE
        self.w_o32 = layer.w_o.float()  # the fp32 output projection, converted once

    def __call__(self) -> torch.Tensor:
        """The partial output [B, hidden] (fp32) of these heads: sum over ranks = the layer's."""
        L, cfg = self.layer, self.cfg
        B, Hs = cfg.batch, L.w_q.shape[0]
        q = torch.einsum("bd,hed->bhe", L.x, L.w_q)  # [B, Hs, 192] bf16
        q_nope = torch.einsum("bhn,hnl->bhl", q[..., :NOPE], L.w_uk)  # absorbed: [B, Hs, 512]
        q_rope = q[..., NOPE:]
        kv = L.x @ L.w_dkv.t()  # [B, 576]: the new token's latent row
        q_rows = self.query.view(B, Hs, 576)
        new_rows = L.new_rows
        mla_rope_quantize_fp8(q_rope, kv[:, LATENT:], q_nope, kv[:, :LATENT], L.cos_sin, L.positions,
                              is_neox=True, quant_scale_q=Q_SCALE, quant_scale_kv=KV_SCALE,
                              q_rope_out=q_rows[..., LATENT:], q_nope_out=q_rows[..., :LATENT],
                              k_rope_out=new_rows[:, LATENT:], k_nope_out=new_rows[:, :LATENT])
        sparse_mla_fp8_decode(self.query, L.kv_cache, None, NOPE, LATENT, ROPE, L.block_tables, L.seq_lens,
                              cfg.context + 1, sparse_mla_top_k=cfg.top_k, out=self.out,
                              bmm1_scale=self.bmm1_scale, bmm2_scale=self.bmm2_scale, metadata=self.metadata)
        o = torch.einsum("bhl,hlv->bhv", self.out.view(B, Hs, LATENT), L.w_uv)  # [B, Hs, 128] bf16
        return torch.einsum("bhv,dhv->bd", o.float(), self.w_o32)  # row-parallel partial, fp32


def fp32_layer(L: Layer, cfg: Config) -> torch.Tensor:
    """The same layer in fp32 without FP8 quantization of q and the new KV row: [B, hidden].

    Earlier tokens come from the FP8 cache (dequantized with KV_SCALE); the result differs
    from the FP8 step by the quantization of q and of the new row (a few percent at most).
    """
    B = cfg.batch
    x = L.x.float()
    q = torch.einsum("bd,hed->bhe", x, L.w_q.float())
    q_nope = torch.einsum("bhn,hnl->bhl", q[..., :NOPE], L.w_uk.float())
    kv = x @ L.w_dkv.float().t()
    cs = L.cos_sin[L.positions]  # [B, 64]
    c, s = cs[:, None, :32], cs[:, None, 32:]

    def rope(t):  # NeoX halves
        t1, t2 = t[..., :32], t[..., 32:]
        return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1)

    q_full = torch.cat([q_nope, rope(q[..., NOPE:])], dim=-1)  # [B, H, 576]
    new_row = torch.cat([kv[:, :LATENT], rope(kv[:, None, LATENT:])[:, 0]], dim=-1)  # [B, 576]
    rows = L.kv_cache.view(-1, 576).float() / KV_SCALE
    out = torch.empty(B, q_full.shape[1], LATENT, device=x.device)
    for b in range(B):
        idx = L.block_tables[b, 0].long()
        idx = idx[: int(L.seq_lens[b])]
        idx = idx[idx >= 0]
        keys = rows[idx].clone()
        keys[idx == idx[0]] = new_row[b]  # slot 0 lists the new token's row
        p = (q_full[b] @ keys.t() / math.sqrt(NOPE + ROPE)).softmax(-1)
        out[b] = p @ keys[:, :LATENT]
    o = torch.einsum("bhl,hlv->bhv", out, L.w_uv.float())
    return torch.einsum("bhv,dhv->bd", o, L.w_o.float())


def _time_step(fn, device: torch.device, iters: int = 20) -> float:
    """Microseconds per call (wall clock, synchronized)."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def _time_step_graph(fn, iters: int = 50) -> float:
    """Microseconds per replay of ``fn`` captured in a CUDA graph (NCCL collectives
    included), as a serving engine runs its decode step."""
    graph = capture_graph(fn)  # one warm-up call on a side stream, then the capture
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepseek", action="store_true", help="DeepSeek-V3.2 sizes: 128 heads, hidden 7168, top-k 2048")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--time", action="store_true", help="also time the TP step against one rank running all heads")
    ap.add_argument("--json", default=None, help="with --time: write the timings to this JSON file (rank 0)")
    args = ap.parse_args(argv)

    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # started without torchrun: one rank holding every head
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # device_id binds the NCCL communicator to this rank's GPU (barrier() then needs no guess)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()

    cfg = Config(batch=32, heads=128, hidden=7168, top_k=2048, context=8192) if args.deepseek else Config()
    cfg = dataclasses.replace(cfg, **{k: v for k, v in (("batch", args.batch), ("heads", args.heads)) if v})
    if cfg.heads % world:
        raise ValueError(f"heads ({cfg.heads}) must be a multiple of the world size ({world})")
    per_rank = cfg.heads // world
    mine = slice(rank * per_rank, (rank + 1) * per_rank)

    step = AttentionStep(build(cfg, mine, device), cfg)

    def tp_step() -> torch.Tensor:
        y = step()
        dist.all_reduce(y)  # sum of the row-parallel partial projections
        return y

    y = tp_step()
    # every rank holds the same result
    gathered = [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(gathered, y)
    if rank == 0:
        for r, other in enumerate(gathered):
            assert torch.equal(other, y), f"rank {r} holds another result"
        full = AttentionStep(build(cfg, slice(0, cfg.heads), device), cfg)
        y_ref = full()
        err = ((y - y_ref).norm() / y_ref.norm()).item()
        # Per head, both runs quantize and attend identically; they differ only in the fp32
        # summation order over heads (all-reduce of partial sums) and, if the decode schedule
        # depends on the head count, in an occasional bf16 rounding of the attention output.
        print(f"tp decode step: world_size={world}, {per_rank} heads per rank, B={cfg.batch}, "
              f"top-k={cfg.top_k}, device={device.type}: relative difference to one process {err:.2e}")
        assert err < 5e-3, err
        torch.testing.assert_close(y, y_ref, rtol=2e-2, atol=2e-2 * y_ref.abs().max().item())
        # and the FP8 step is the layer: against fp32 math without quantizing q or the new row
        y32 = fp32_layer(full.layer, cfg)
        err32 = ((y - y32).norm() / y32.norm()).item()
        print(f"relative difference to the unquantized fp32 layer {err32:.2e} (FP8 quantization of q and kv)")
        assert err32 < 0.1, err32
    if args.time:
        t_tp = _time_step(tp_step, device)
        t_tp_graph = _time_step_graph(tp_step) if cuda else None
        if rank == 0:
            full = AttentionStep(build(cfg, slice(0, cfg.heads), device), cfg)
            t_one = _time_step(full, device)
            t_one_graph = _time_step_graph(full) if cuda else None
            print(f"time per step (eager): {t_tp:.1f} us on {world} ranks, {t_one:.1f} us with all heads on one")
            if cuda:
                print(f"time per step (CUDA graph replay): {t_tp_graph:.1f} us on {world} ranks, "
                      f"{t_one_graph:.1f} us with all heads on one")
            if args.json:
                import json

                payload = {"world_size": world, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                           "backend": dist.get_backend(), "config": dataclasses.asdict(cfg),
                           "us_per_step_tp": t_tp, "us_per_step_one_rank_all_heads": t_one,
                           "us_per_step_tp_graph": t_tp_graph, "us_per_step_one_rank_all_heads_graph": t_one_graph}
                with open(args.json, "w") as f:
                    json.dump(payload, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("ok")


if __name__ == "__main__":
    main()
