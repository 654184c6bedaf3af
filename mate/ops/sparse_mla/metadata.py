"""Work schedule of the FP8 sparse MLA decode (``get_batch_decode_metadata_mla``).

The schedule depends only on (B, q_len, H, top-k) and the device, never on the values of
``seq_lens``: the kernels read those on the device. Planning picks how many heads one
program handles, how the top-k list of each query position is split across programs, the
launch configuration, and preallocates the scratch space the split path needs (fp16
partial outputs, fp32 log-sum-exps), so a decode call given the metadata allocates nothing
and never syncs with the host.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["DecodeMetadata", "plan_decode", "BLOCK_N", "HEAD_DIM_V", "HEAD_DIM_ROPE"]

BLOCK_N = 64  # gathered rows (top-k slots) per step; sparse_mla_top_k is a multiple of it
HEAD_DIM_V = 512  # kv_lora_rank: the value part of each 576-value row
HEAD_DIM_ROPE = 64  # qk_rope_head_dim: the rotary tail of each row

# SM count assumed when planning for a device that is not a GPU (the interpreter): small,
# so that CPU tests exercise the split + combine path with a handful of programs.
_CPU_VIRTUAL_SMS = 4


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeMetadata:
    """Reusable plan of ``sparse_mla_fp8_decode`` for one (B, q_len, H, top-k, device).

    Attributes
    ----------
    batch_size, q_len, num_heads, top_k : int
        The configuration the plan was made for; a decode call with another one raises.
    device : torch.device
        Where the scratch buffers live.
    block_h : int
        Heads of one query position per program: 64 for H > 32 (padded), else H rounded
        up to a power of two (at least 16).
    transposed : bool
        True for the small-H kernel (H <= 32) that computes Sᵀ = K·Qᵀ with the gathered
        rows on the MMA's M side, so no M rows are padding.
    block_n : int
        Gathered rows (top-k slots) per step.
    num_head_tiles : int
        ``ceil(H / block_h)``.
    num_splits : int
        Programs per (query position, head tile), each over ``split_blocks * 64`` slots of
        the top-k list. 1 means no split and no combine step.
    split_blocks : int
        Blocks of 64 slots per split.
    num_warps, num_stages : int
        Launch configuration of the split kernel.
    partial_o : torch.Tensor
        [B * q_len, num_splits, H, 512] partial outputs, each normalised by its own softmax
        sum, so a convex combination of e4m3 values (|o| <= 448): fp16 by default (half the
        scratch traffic of fp32, 2**-11 relative rounding, below the bf16 output's 2**-8);
        shape [0] when ``num_splits == 1``.
    partial_lse : torch.Tensor
        fp32 [B * q_len, num_splits, H] natural-log LSE of each split (-inf when the split
        has no valid slot); shape [0] when ``num_splits == 1``.
    lse_scratch : torch.Tensor
        fp32 [B * q_len, H]: where the LSE goes when the caller asked for none.
    """

    batch_size: int
    q_len: int
    num_heads: int
    top_k: int
    device: torch.device
    block_h: int
    transposed: bool
    block_n: int
    num_head_tiles: int
    num_splits: int
    split_blocks: int
    num_warps: int
    num_stages: int
    partial_o: torch.Tensor
    partial_lse: torch.Tensor
    lse_scratch: torch.Tensor

    @property
    def config(self) -> tuple[int, int, int, int, torch.device]:
        """(B, q_len, H, top-k, device) the plan was made for."""
        return (self.batch_size, self.q_len, self.num_heads, self.top_k, self.device)

    def check_matches(self, batch_size: int, q_len: int, num_heads: int, top_k: int, device: torch.device) -> None:
        """``ValueError`` unless the plan was made for this configuration."""
        given = (batch_size, q_len, num_heads, top_k, torch.device(device))
        if given != self.config:
            want = dict(zip(("B", "q_len", "H", "top_k", "device"), self.config))
            got = dict(zip(("B", "q_len", "H", "top_k", "device"), given))
            raise ValueError(
                f"metadata must be prepared for the call's configuration {got} "
                f"(call get_batch_decode_metadata_mla again), got metadata for {want}"
            )


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _CPU_VIRTUAL_SMS


def _launch_config(transposed: bool) -> tuple[int, int, int]:
    """(num_warps, num_stages, programs resident per SM), from H200 compiles of the kernels.

    Both kernels use 254-255 registers per thread at 8 warps without spilling (the 64x512
    fp32 accumulator, or the 512x64 fp16 Vᵀ operand of the small-H kernel), so one
    program fits per SM; the stages keep several gathered tiles in flight.
    """
    if transposed:
        return 8, 6, 1
    return 8, 5, 1


def plan_decode(
    batch_size: int,
    q_len: int,
    num_heads: int,
    top_k: int,
    device: torch.device | str,
    *,
    num_sms: int | None = None,
    num_splits: int | None = None,
    block_h: int | None = None,
    num_stages: int | None = None,
    partial_dtype: torch.dtype = torch.float16,
) -> DecodeMetadata:
    """Builds the plan; ``num_sms`` / ``num_splits`` / ``block_h`` / ``num_stages`` /
    ``partial_dtype`` (fp16 or fp32 split outputs) override the device-derived choices
    (tests and benchmarks: ``block_h=64`` pads a small H)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if block_h is None:
        block_h = 64 if num_heads > 32 else max(16, 1 << max(0, num_heads - 1).bit_length())
    if partial_dtype not in (torch.float16, torch.float32):
        raise ValueError(f"partial_dtype must be torch.float16 or torch.float32, got {partial_dtype}")
    if block_h not in (16, 32, 64):
        raise ValueError(f"block_h must be one of (16, 32, 64), got {block_h}")
    transposed = block_h <= 32
    num_head_tiles = -(-num_heads // block_h)
    num_warps, default_stages, per_sm = _launch_config(transposed)
    num_stages = default_stages if num_stages is None else int(num_stages)
    n_blocks = top_k // BLOCK_N
    rows = batch_size * q_len
    if num_splits is None:
        sms = _num_sms(device) if num_sms is None else num_sms
        # Fill every SM with `per_sm` programs when the query positions alone do not; on
        # the GPU keep at least 4 blocks (256 slots) per split so that the combine step
        # and the per-program prologue stay cheap.
        base = max(1, rows * num_head_tiles)
        slots = sms * per_sm
        min_blocks = 4 if device.type == "cuda" else 1
        max_splits = max(1, n_blocks // min_blocks)
        # Relative makespan of s splits: waves of programs times the length of one program.
        # A larger s must win by more than 10% (the combine step and prologues cost).
        best, best_cost = 1, float(-(-base // slots))
        for s in range(2, max_splits + 1):
            cost = -(-base * s // slots) / s
            if cost < 0.9 * best_cost:
                best, best_cost = s, cost
        num_splits = best
    num_splits = max(1, min(int(num_splits), n_blocks))
    split_blocks = -(-n_blocks // num_splits)
    num_splits = -(-n_blocks // split_blocks)  # no empty split
    if num_splits > 1:
        partial_o = torch.empty((rows, num_splits, num_heads, HEAD_DIM_V), dtype=partial_dtype, device=device)
        partial_lse = torch.empty((rows, num_splits, num_heads), dtype=torch.float32, device=device)
    else:
        partial_o = torch.empty((0,), dtype=torch.float32, device=device)
        partial_lse = torch.empty((0,), dtype=torch.float32, device=device)
    lse_scratch = torch.empty((rows, num_heads), dtype=torch.float32, device=device)
    return DecodeMetadata(
        batch_size=batch_size,
        q_len=q_len,
        num_heads=num_heads,
        top_k=top_k,
        device=device,
        block_h=block_h,
        transposed=transposed,
        block_n=BLOCK_N,
        num_head_tiles=num_head_tiles,
        num_splits=num_splits,
        split_blocks=split_blocks,
        num_warps=num_warps,
        num_stages=num_stages,
        partial_o=partial_o,
        partial_lse=partial_lse,
        lse_scratch=lse_scratch,
    )
