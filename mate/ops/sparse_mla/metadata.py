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

from mate._core import checks
from mate._core.hopper import REGS_PER_SM, cuda_capability, planning_sm_count

__all__ = ["DecodeMetadata", "plan_decode", "plan_settings", "pdl_combine", "BLOCK_N", "HEAD_DIM_V", "HEAD_DIM_ROPE",
           "GLUON_STAGES", "GLUON_MAX_STAGES", "GLUON_SMALL_H_STAGES", "GLUON_WG_STAGES", "PDL_MAX_GRID_FRACTION"]

BLOCK_N = 64  # sparse_mla_top_k is a multiple of it; the 64-head kernel's rows per step
HEAD_DIM_V = 512  # kv_lora_rank: the value part of each 576-value row
HEAD_DIM_ROPE = 64  # qk_rope_head_dim: the rotary tail of each row

# Shared-memory ring of the Gluon kernel (decode_gluon.py): 2 gathered tiles of 36 KB + the
# query (36 KB) + fp16 V (two 32 KB halves) and two P (8 KB) tiles = 188 KB (H200 compile:
# 250 registers, no spills); 3 stages (224 KB) are allowed, 4 would need 260 KB, over the 227
# KB an SM offers. H200, session 24 (top-k 2048, interleaved, with the 16-byte output store;
# us at 2 / 3 stages): B=64 q1 H=128 82.4 / 84.5, B=128 q2 H=128 316.1 / 323.9, B=128 q1 H=64
# 83.2 / 86.6, B=128 q1 H=128 160.6 / 165.9, B=32 q1 H=128 (2 splits) 50.3 / 51.1, B=8 q1
# H=128 (8 splits of 4 blocks) 22.2 / 23.2. Before the store change 3 stages were the default
# (2026-11-29: B=64 H=128 89.7 at 3, 90.5 at 2; B=128 q2 348.1 / 339.4; B=128 H=64 92.3 / 90.8).
GLUON_STAGES = 2
GLUON_MAX_STAGES = 3
# Ring of the small-H Gluon kernel (decode_gluon_small_h.py, Vᵀ from registers): 5 gathered
# tiles of 36 KB + Q + two P tiles = 193 KB at 16 heads, 207 KB at 32 (H200 compile: 173 /
# 209 registers, no spills).
GLUON_SMALL_H_STAGES = 5
# Ring of the one-warpgroup small-H Gluon kernel (decode_gluon_small_h2.py, the Hopper default
# for H <= 16): 2 gathered tiles + Q + two P tiles = 85 KB, 255 registers at 4 warps, so 2
# programs share an SM and the plan splits to fill both (H200, top-k 2048, interleaved, copy
# 4188 GB/s: B=128 q1 H=16 2 splits 61.5 us = 58.6% of copy against 68.8 for the 8-warp
# kernel; B=64 q1 4 splits 40.4 against 43.2; B=64 q2 2 splits 58.4 against 66.0; B=32 q2
# 38.9 against 42.7). At 32 heads it spills (91.4 against 80.6).
GLUON_WG_STAGES = 2
# Split plans of H > 32 run the 64-head Gluon kernel from this many 64-key blocks per split,
# the plain kernel with prefetched indices below; when splits of this many blocks need at most
# one program per SM (B * q_len * head tiles <= 8 at top-k 2048 on 132 SMs), a Gluon plan takes
# them (plan_decode; the small-H kernels too: B=1 q1 H=16 16 splits of 2 blocks 10.7 us against
# 8 of 4 11.7, B=1 q2 H=16 11.1 / 12.2, B=2 q1 H=16 11.0 / 12.3, B=4 q1 H=16 11.6 / 12.3, B=1
# q1 H=32 13.7 / 16.2, B=2 q1 H=32 14.2 / 17.4; 32 of 1 block slower, 14.5-18.1; FlashMLA
# 17.9-18.7, ``probe_sparse_mla_small_b.py --small-h``). H200, session 25 (``probe_sparse_mla_small_b.py --splits``, top-k 2048,
# interleaved, us; 8 Gluon splits of 4 blocks / 16 of 2 / 32 of 1 / the plain kernel on 16 of 2,
# FlashMLA in parentheses): B=1 q1 H=128 19.2 / 16.5 / 25.0 / 18.6 (17.8), B=1 q2 H=128 19.6 /
# 17.8 / 26.9 / 19.3 (17.2), B=2 q1 H=128 19.6 / 17.8 / 27.1 / 19.0 (17.1), B=4 q1 H=128 20.1 /
# 19.7 / 54.3 / 21.2 (19.6), B=1 q1 H=64 19.0 / 15.9 / 20.1 / 18.0 (18.0), B=2 q1 H=64 19.4 /
# 16.5 / 25.0 / 18.5 (18.6). Session 24 (top-k 2048, interleaved, the 16-byte output store;
# plain prefetched / Gluon at 2 stages in us; FlashMLA 26.2 at B=8 q1 H=128 in that session's
# benchmark): 4 blocks per split:
# B=1 q1 H=128 24.5 / 20.1, B=8 q1 H=128 26.2 / 22.2, B=8 q1 H=64 25.0 / 20.7; 8 blocks: B=8
# q2 H=128 43.1 / 31.4, B=16 q1 H=128 43.2 / 31.4; 16 blocks: B=32 q1 H=128 76.6 / 50.3. Before
# the store change the threshold was 8 blocks (2026-11-30, 4 blocks: B=8 q1 H=128 28.7 / 31.4).
GLUON_MIN_SPLIT_BLOCKS = 2

PDL_MAX_GRID_FRACTION = 0.5
"""A split Gluon plan launches its combine as a programmatic dependent of the decode
(:attr:`DecodeMetadata.pdl`) when the decode grid has at most this fraction of the GPU's SMs
in programs (0: never). The decode executes ``griddepcontrol.launch_dependents`` at its start
and the combine ``griddepcontrol.wait`` before its first load, so the combine reads nothing
early and its programs wait, already resident, on the SMs the decode leaves idle. With a grid
that fills the GPU they crowd onto the few idle SMs and the combine runs slower. H200,
session 25 (``benchmarks/probe_sparse_mla_pdl.py``, us, without / with, bit-identical): B=1 q1
H=128 (16 programs) 20.5 / 19.5, B=1 q2 20.3 / 19.7, B=8 q1 H=64 (64) 20.9 / 20.3; B=8 q1
H=128 (128 programs) 22.3 / 23.8, B=16 q1 H=128 (128) 31.7 / 32.1, B=32 q1 H=128 (128) 50.3 /
50.2. Benchmark run 15 (the plan's choice against ``pdl=False`` / ``True``): B=1 q1 H=128 19.3
/ 20.2, B=1 q1 H=16 (one-warpgroup kernel, 8 programs) 11.8 / 12.2, B=8 q1 H=128 22.2 / 23.8;
run 16, with 16 splits of 2 blocks at B=1 q1 H=128 (32 programs): 16.4 / 17.1."""


def plan_settings() -> tuple:
    """The module settings :func:`plan_decode`'s defaults depend on (a plan kept for reuse is
    keyed by them too: benchmarks and tests switch them between calls)."""
    return (GLUON_STAGES, GLUON_MAX_STAGES, GLUON_SMALL_H_STAGES, GLUON_WG_STAGES, GLUON_MIN_SPLIT_BLOCKS,
            PDL_MAX_GRID_FRACTION)


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
        True (the default for H <= 32) for the small-H kernel that computes Sᵀ = K·Qᵀ with
        the gathered rows on the wgmma M side, so no M rows are padding. False with
        ``block_h`` 16 or 32 selects the mma.sync kernel on 16-row tiles (a plan option:
        measured slower on the H200, see ``decode.py``).
    block_n : int
        Gathered rows (top-k slots) per step: 64, or 16 for the mma.sync small-H kernel.
    num_head_tiles : int
        ``ceil(H / block_h)``.
    num_splits : int
        Programs per (query position, head tile), each over ``split_blocks * block_n`` slots of
        the top-k list. 1 means no split and no combine step.
    split_blocks : int
        Blocks of ``block_n`` slots per split.
    num_warps, num_stages : int
        Launch configuration of the split kernel.
    max_regs : int
        Register cap per thread passed to the compiler (``maxnreg``); 0 for none.
    prefetch_idx : bool
        Load each step's top-k indices one step ahead into registers, so the compiler's
        pipeliner keeps ``num_stages - 1`` gathered tiles in flight instead of 2 (H200
        compiles: transposed small-H kernel at 6 stages, 5 buffers, 200 KB of shared memory,
        255 registers; 64 heads at 4 stages, 3 buffers, 217 KB). Off by default until
        measured faster.
    chains : int
        Independent one-warpgroup chains per program: 1, or 2 for the dual kernel of
        ``decode_gluon_small_h2.py`` (the one-warpgroup small-H kernel twice in one 8-warp
        program, ``gl.warp_specialize``, merged in shared memory): each program then covers
        ``2 * split_blocks`` blocks, so a plan that wants two chains per query position needs no
        combine step. The default for the one-warpgroup kernel when its split plan has two or
        more chains per query position and at least as many chains as SMs (H200, top-k 2048,
        interleaved, us, one chain per program -> dual: B=128 q1 H=16 55.1 -> 50.5, B=64 q1
        37.7 -> 34.5, B=64 q2 53.3 -> 49.6, B=32 q2 35.6 -> 33.5; B=1 q1, 8 chains, 14.6 ->
        18.9: there pairing chains halves the SMs that gather). ``plan_decode(...,
        chains=2)`` forces it (the one-warpgroup kernel only), ``chains=1`` keeps one chain.
    pdl : bool
        Launch the combine of a split Gluon plan as a programmatic dependent of the decode
        (programmatic dependent launch: the combine's programs become resident while the
        decode runs and wait for it to complete before their first load). The default when the
        decode grid has at most ``PDL_MAX_GRID_FRACTION`` of the SMs in programs
        (:func:`pdl_combine`); ``plan_decode(..., pdl=False)`` turns it off, ``pdl=True``
        forces it on a split Gluon plan.
    gluon : bool
        Run the Gluon kernel (``decode_gluon.py``; 64 heads per program on Hopper, Q·Kᵀ
        split across the two warpgroups and issued ahead of P·V, cp.async gather ring)
        instead of the plain-Triton one: the Hopper default for H > 32 without a split or
        with splits of at least ``GLUON_MIN_SPLIT_BLOCKS`` blocks, forced with
        ``plan_decode(..., gluon=True)``. It needs
        ``block_h`` 64 (``ValueError`` otherwise) and a compute capability 9.x GPU
        (``NotImplementedError`` on another GPU); on a device that is not a GPU the
        interpreter cannot run Gluon and the plan falls back to the plain kernel (False).
        With ``transposed=True`` (``block_h`` 16 or 32), ``gluon=True`` selects the small-H
        Gluon kernel instead (``decode_gluon_small_h.py``: Sᵀ = K·Qᵀ, rows on M, Vᵀ from
        registers; ``num_stages`` 2-5, default ``GLUON_SMALL_H_STAGES``), the Hopper default
        for 17 <= H <= 32 (split plans included); with ``num_warps`` 4, the default for
        ``block_h`` 16, its one-warpgroup variant (``decode_gluon_small_h2.py``: 2 programs per
        SM, ``num_stages`` 2 or 3, default ``GLUON_WG_STAGES``), the Hopper default for H <= 16:
        the split count fills 2 programs per SM.
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
    max_regs: int
    prefetch_idx: bool
    gluon: bool
    chains: int
    pdl: bool
    # scratch space, not part of the plan's value (dumps record only its shape)
    partial_o: torch.Tensor = dataclasses.field(compare=False)
    partial_lse: torch.Tensor = dataclasses.field(compare=False)
    lse_scratch: torch.Tensor = dataclasses.field(compare=False)

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


def _launch_config(block_h: int, transposed: bool) -> tuple[int, int, int, int, int]:
    """(block_n, num_warps, num_stages, max_regs, programs resident per SM), from H200
    compiles (0 for ``max_regs`` leaves the register count to the compiler).

    64 heads (wgmma) and the transposed small-H kernel use 254-255 registers per thread at
    8 warps (the 64x512 fp32 accumulator, or the 512x64 fp16 Vᵀ operand), so one program
    fits per SM and the stages keep several gathered tiles in flight. The optional mma.sync
    small-H kernel on 16-row tiles at 4 warps and 5 stages (two gather buffers): 16 heads
    compile to 128 registers under ``maxnreg=128`` without spilling and 54 KB of shared
    memory, so 4 programs share an SM; 32 heads take 245 registers and 73 KB (2 per SM).
    """
    if transposed:
        return 64, 8, 6, 0, 1
    if block_h == 64:
        return 64, 8, 5, 0, 1
    if block_h == 16:
        return 16, 4, 5, 128, 4
    return 16, 4, 5, 0, 2


def _resident_per_sm(block_h: int, block_n: int, num_warps: int, max_regs: int, transposed: bool) -> int:
    """Programs per SM of an overridden launch configuration (H200 compiles; 1 if unknown)."""
    if transposed or block_h == 64:
        return 1
    if max_regs:  # registers bound it (the shared memory of these configs fits 4 per SM)
        return max(1, min(4, REGS_PER_SM // (32 * num_warps * max_regs)))
    known = {(16, 16, 4): 2, (16, 16, 8): 2, (16, 32, 8): 2, (32, 16, 4): 2}  # 124-245 registers
    return known.get((block_h, block_n, num_warps), 1)


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
    block_n: int | None = None,
    num_warps: int | None = None,
    max_regs: int | None = None,
    transposed: bool | None = None,
    prefetch_idx: bool | None = None,
    gluon: bool | None = None,
    chains: int | None = None,
    pdl: bool | None = None,
) -> DecodeMetadata:
    """Builds the plan; ``num_sms`` / ``num_splits`` / ``block_h`` / ``num_stages`` /
    ``partial_dtype`` (fp16 or fp32 split outputs) / ``block_n`` / ``num_warps`` /
    ``max_regs`` (the compiler's ``maxnreg``, 0 for none) / ``transposed`` (the
    Sᵀ = K·Qᵀ small-H kernel, default for ``block_h`` <= 32; False: mma.sync) /
    ``prefetch_idx`` (indices loaded one step ahead, more gather buffers) / ``gluon``
    (the Gluon kernel, see :class:`DecodeMetadata`) / ``chains`` (2: two one-warpgroup
    chains per program; ``num_splits`` then counts programs) / ``pdl`` (the split combine as a
    programmatic dependent) override the device-derived choices (tests and benchmarks:
    ``block_h=64`` pads a small H).

    Defaults measured on the H200 (top-k 2048, CUDA-graph replay): on Hopper, H > 32 runs
    the Gluon kernel on 64-head tiles (H padded to them) at ``GLUON_STAGES`` (2) stages
    (2026-11-29, 3 stages then: B=64 q1 H=128: 89.7 us against 139.6 for the plain kernel;
    session 24, 2 stages: 82.4, B=128 q2 H=128 316.1, B=128 H=64 83.2), split or not; split
    plans with fewer than ``GLUON_MIN_SPLIT_BLOCKS`` (2) blocks per split run the plain kernels
    with prefetched indices (B=8 q1 H=128, 8 splits of 4 blocks: Gluon 22.2 us against 26.2
    for the plain kernel and FlashMLA's 26.2), and a Gluon plan whose splits of that many blocks
    need at most one program per SM takes them (B=1 q1 H=128: 16 splits of 2 blocks, 16.5 us
    against 19.3 for 8 of 4 and FlashMLA's 17.8; B=4 q1 H=128 19.7 against 20.0; B=1 q1 H=32
    13.7 against 16.2). H <= 32
    runs the small-H Gluon kernel, split or not (B=128 q1 H=16: 67.9 us against 87.1 for
    the 64-head kernel on padded heads and 102.4 for the plain transposed kernel; H=32:
    79.2 against 87.9; B=64 q1 H=16, 2 splits: 43.2 against 57.8; B=64 q2 H=16: 65.8
    against 85.4); H <= 16 its one-warpgroup variant with 2 programs per SM (B=128 q1 H=16:
    61.5 us = 58.6% of copy against 68.8 for the 8-warp kernel in the same run; see
    ``GLUON_WG_STAGES``)."""
    explicit_launch = block_n is not None or num_warps is not None or max_regs is not None
    if (gluon is None and block_h is None and transposed is None and prefetch_idx is None
            and num_stages is None and not explicit_launch and num_heads <= 32 and _is_hopper(device)):
        # small H: the transposed small-H Gluon kernel, split or not
        common = dict(num_sms=num_sms, num_splits=num_splits, partial_dtype=partial_dtype, chains=chains, pdl=pdl)
        return plan_decode(batch_size, q_len, num_heads, top_k, device, gluon=True, transposed=True, **common)
    auto_gluon = gluon is None
    if auto_gluon:
        gluon = (prefetch_idx is not True and not explicit_launch and _is_hopper(device)
                 and (block_h == 64 or (block_h is None and num_heads > 32)))
    user_stages = num_stages
    if prefetch_idx is None:
        prefetch_idx = not gluon
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if block_h is None:
        block_h = 64 if num_heads > 32 else max(16, 1 << max(0, num_heads - 1).bit_length())
    if partial_dtype not in (torch.float16, torch.float32):
        raise ValueError(f"partial_dtype must be torch.float16 or torch.float32, got {partial_dtype}")
    if block_h not in (16, 32, 64):
        raise ValueError(f"block_h must be one of (16, 32, 64), got {block_h}")
    small_h_gluon = bool(gluon) and transposed is True  # only asked for explicitly, until measured
    if transposed is None:
        transposed = block_h <= 32
    if transposed and block_h == 64:
        raise ValueError(f"transposed needs block_h 16 or 32, got block_h {block_h}")
    num_head_tiles = -(-num_heads // block_h)
    auto_chains = chains is None and num_splits is None
    chains = 1 if chains is None else chains
    checks.check_choice("chains", chains, (1, 2))
    if chains == 2 and not (small_h_gluon and _gluon_warps(block_h, small_h_gluon, num_warps) == 4):
        raise ValueError("chains=2 needs the one-warpgroup small-H Gluon kernel (gluon=True, transposed=True, "
                         f"block_h 16, num_warps 4), got gluon={gluon}, transposed={transposed}, block_h={block_h}, "
                         f"num_warps={num_warps}")
    if gluon:
        gluon = _check_gluon(device, block_h, block_n, num_warps, max_regs, prefetch_idx, num_stages,
                             small_h_gluon)
    if chains == 2 and num_stages is not None and int(num_stages) != 2:
        raise ValueError(f"chains=2 needs num_stages 2 (two rings of 3 stages do not fit in shared memory), "
                         f"got num_stages={num_stages}")
    if not gluon:
        chains = 1  # not a GPU: the plain kernel (as gluon=True does)
    if gluon:  # fixed launch configuration (H200 compile)
        num_warps = _gluon_warps(block_h, small_h_gluon, num_warps)
        block_n, max_regs, prefetch_idx = 64, 0, False
        if num_stages is None:
            num_stages = (GLUON_WG_STAGES if num_warps == 4 else GLUON_SMALL_H_STAGES) if transposed else GLUON_STAGES
    default_n, default_warps, default_stages, default_regs, per_sm = _launch_config(block_h, transposed)
    if gluon:
        per_sm = 2 if num_warps == 4 else 1  # the one-warpgroup kernel: 2 chains per SM (either kernel)
    elif block_n is None and num_warps is None and max_regs is None:
        block_n, num_warps, max_regs = default_n, default_warps, default_regs
    else:
        block_n = default_n if block_n is None else int(block_n)
        num_warps = default_warps if num_warps is None else int(num_warps)
        max_regs = 0 if max_regs is None else int(max_regs)
        per_sm = _resident_per_sm(block_h, block_n, num_warps, max_regs, transposed)
    allowed_n = (64,) if block_h == 64 or transposed else (16, 32, 64)
    if block_n not in allowed_n:
        raise ValueError(f"block_n must be one of {allowed_n} for block_h {block_h}, got {block_n}")
    if num_stages is None:
        # With prefetched indices every stage but one holds a gathered tile (36 KB at 64
        # rows): 4 stages (217 KB of shared memory) is the most the 64-head kernel fits.
        num_stages = 4 if prefetch_idx and block_h == 64 else default_stages
    num_stages = int(num_stages)
    n_blocks = top_k // block_n
    rows = batch_size * q_len
    sms = planning_sm_count(device, _CPU_VIRTUAL_SMS) if num_sms is None else num_sms
    if num_splits is None:
        # Fill every SM with `per_sm` programs when the query positions alone do not; on
        # the GPU keep at least 256 slots per split so that the combine step and the
        # per-program prologue stay cheap (64 on the CPU, to test splits on small lists).
        base = max(1, rows * num_head_tiles)
        slots = sms * per_sm
        min_blocks = max(1, (256 if device.type == "cuda" else 64) // block_n)
        best = _choose_splits(base, slots, max(1, n_blocks // min_blocks))
        short = -(-n_blocks // GLUON_MIN_SPLIT_BLOCKS)
        if gluon and device.type == "cuda" and best < short and base * short <= sms:
            best = short  # a Gluon kernel: GLUON_MIN_SPLIT_BLOCKS-block splits, one program per SM at most
        num_splits = best
        if (auto_chains and gluon and small_h_gluon and num_warps == 4 and num_stages == 2 and best > 1
                and base * best >= sms):
            chains = 2  # as many chains as programs would run, in half the programs, fewer to combine
    else:
        num_splits = int(num_splits) * chains  # the caller counts programs
    num_splits = max(1, min(num_splits, n_blocks))
    split_blocks = -(-n_blocks // num_splits)
    num_splits = -(-n_blocks // split_blocks)  # no empty split
    # num_splits counted chains so far (the dual kernel's second chain of the last program
    # may be empty); from here on it counts programs, each over chains * split_blocks blocks
    num_splits = -(-num_splits // chains)
    if auto_gluon and gluon and num_splits > 1 and split_blocks < GLUON_MIN_SPLIT_BLOCKS:
        # 1-block splits (only when a caller asks for that many) run the plain kernel with
        # prefetched indices, as short splits did before the Gluon kernel's 16-byte stores; the
        # 64-head Gluon kernel on 32 splits of 1 block took 25.0 us at B=1 q1 H=128 against
        # 16.5 on 16 of 2 (the split count does not depend on the kernel: both run one
        # program per SM)
        gluon, prefetch_idx = False, True
        num_stages = 4 if user_stages is None else int(user_stages)
    split_gluon = bool(gluon) and num_splits > 1
    if pdl is None:
        pdl = split_gluon and pdl_combine(num_head_tiles * num_splits * rows, sms)
    elif pdl and not split_gluon:
        raise ValueError(f"pdl=True needs a split Gluon plan, got gluon={bool(gluon)}, num_splits={num_splits}")
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
        block_n=block_n,
        num_head_tiles=num_head_tiles,
        num_splits=num_splits,
        split_blocks=split_blocks,
        num_warps=num_warps,
        num_stages=num_stages,
        max_regs=max_regs,
        prefetch_idx=bool(prefetch_idx),
        gluon=bool(gluon),
        chains=chains,
        pdl=bool(pdl),
        partial_o=partial_o,
        partial_lse=partial_lse,
        lse_scratch=lse_scratch,
    )


def _choose_splits(base: int, slots: int, max_splits: int) -> int:
    """Split count for ``base`` programs per split on ``slots`` resident program slots: the
    relative makespan of s splits is waves of programs times the length of one program, and a
    larger s must win by more than 10% (the combine step and prologues cost). Session 25
    measured a model with the blocks per split rounded up (ceil(n_blocks / s)) slower where it
    differs from this one: B=24 q1 H=64 11 splits of 3 blocks 42.2 us against 5 of 7 29.2,
    B=12 q2 H=128 8 of 4 58.7 against 5 of 7 53.3, B=6 q1 H=128 11 of 3 22.0 against 8 of 4
    21.3 (``probe_sparse_mla_small_b.py --plans``)."""
    best, best_cost = 1, float(-(-base // slots))
    for s in range(2, max_splits + 1):
        cost = -(-base * s // slots) / s
        if cost < 0.9 * best_cost:
            best, best_cost = s, cost
    return best


def pdl_combine(decode_programs: int, num_sms: int) -> bool:
    """Whether a split Gluon plan whose decode grid has ``decode_programs`` programs launches
    its combine as a programmatic dependent (:data:`PDL_MAX_GRID_FRACTION` of ``num_sms``)."""
    return PDL_MAX_GRID_FRACTION > 0 and decode_programs <= PDL_MAX_GRID_FRACTION * num_sms


def _cuda_capability(device: torch.device | str) -> tuple[int, int] | None:
    """Compute capability of a CUDA device; None for another device."""
    device = torch.device(device)
    return cuda_capability(device) if device.type == "cuda" else None


def _is_hopper(device: torch.device | str) -> bool:
    cap = _cuda_capability(device)
    return cap is not None and cap[0] == 9


def _gluon_warps(block_h: int, small_h: bool, num_warps: int | None) -> int:
    """Warps of a Gluon plan: 4 (the one-warpgroup small-H kernel) by default for ``block_h``
    16, else 8."""
    if num_warps is not None:
        return int(num_warps)
    return 4 if small_h and block_h == 16 else 8


def _check_gluon(device: torch.device, block_h: int, block_n: int | None, num_warps: int | None,
                 max_regs: int | None, prefetch_idx: bool, num_stages: int | None, small_h: bool = False) -> bool:
    """Validates ``gluon=True``; returns whether the plan uses the Gluon kernel (False on a
    device that is not a GPU: Gluon does not run under the interpreter). ``small_h``: the
    small-H Gluon kernel (``transposed=True``, ``block_h`` 16 or 32)."""
    if not small_h:
        checks.check_value("block_h", block_h == 64, "64 with gluon=True (H > 32 or block_h=64)", block_h)
    for name, given, want in (("block_n", block_n, 64), ("max_regs", max_regs, 0)):
        checks.check_value(name, given is None or int(given) == want, f"{want} (or unset) with gluon=True", given)
    if small_h:
        checks.check_choice("num_warps", 8 if num_warps is None else int(num_warps), (4, 8))
    else:
        checks.check_value("num_warps", num_warps is None or int(num_warps) == 8, "8 (or unset) with gluon=True",
                           num_warps)
    checks.check_value("prefetch_idx", not prefetch_idx, "False with gluon=True (the Gluon kernel has its own ring)",
                       prefetch_idx)
    if num_stages is not None:
        if not small_h:
            stages = tuple(range(2, GLUON_MAX_STAGES + 1))
        elif _gluon_warps(block_h, small_h, num_warps) == 4:
            stages = (2, 3)
        else:
            stages = (2, 3, 4, 5)
        checks.check_choice("num_stages", int(num_stages), stages)
    cap = _cuda_capability(device)
    if cap is None:
        return False
    major, minor = cap
    if major != 9:
        raise NotImplementedError(
            f"gluon=True needs a Hopper GPU (compute capability 9.x), got compute capability {major}.{minor}"
        )
    return True
