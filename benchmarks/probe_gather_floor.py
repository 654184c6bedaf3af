"""How fast can the H200 gather random 576-byte rows (the sparse MLA cache's) with plain loads?

    python benchmarks/probe_gather_floor.py

The sparse MLA small-H decode (B = 128, q_len 1, top-k 2048: 151 MB of gathered rows) is
measured against the copy bandwidth; a gather that only reads the same rows with the decode
kernel's cp.async pieces and grid (one program per SM) moved 77.5% of copy (2026-11-29). This
probe reads the same number of random rows with ordinary vector loads into registers (no
shared memory, no compute), many programs per SM, to see whether that figure is the access
pattern's or the gather scheme's: each program reads ``ROWS`` rows (``R`` at a time) of a
[tokens, 576] e4m3 cache viewed as int32 [tokens, 144] (a 512-byte and a 64-byte piece per
row) and XORs them into a checksum. ``random``: the sparse MLA benchmark's index distribution
(uniform over all tokens); ``sequential``: consecutive rows (the coalesced control).

H200, 2026-11-30 (151 MB; the copy timed inside the interleaved graphs read 2709 GB/s, low as
``bench_msa_fp8_decode_variants`` notes, so the fractions below use the copy of the other
calls, ~4240 GB/s): random rows 37.7-39.2 us (3.86-4.01 TB/s, ~91-94%) with 32-256 rows per
program, as fast as consecutive rows (37.3-38.4); one program per query (128 programs, 2048
rows each, 64 rows per load, nothing in flight across iterations) 75.0 us. Random 576-byte
rows are no harder for DRAM than a stream; what a gather needs is enough of them in flight.
``probe_sparse_mla_small_h_parts`` times the decode kernels' own cp.async gather the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate.testing.bench import bandwidth_lines, time_interleaved


@triton.jit
def gather_rows_kernel(kv_ptr, idx_ptr, out_ptr, ROWS: tl.constexpr, R: tl.constexpr):
    pid = tl.program_id(0)
    offs_r = tl.arange(0, R)
    c_main = tl.arange(0, 128)  # 512 bytes
    c_tail = tl.arange(0, 16)  # 64 bytes
    acc = tl.zeros([R, 128], dtype=tl.int32)
    acc_t = tl.zeros([R, 16], dtype=tl.int32)
    base = pid.to(tl.int64) * ROWS
    for i in range(0, ROWS, R):
        tok = tl.load(idx_ptr + base + i + offs_r).to(tl.int64)
        row = kv_ptr + tok[:, None] * 144
        acc ^= tl.load(row + c_main[None, :])
        acc_t ^= tl.load(row + 128 + c_tail[None, :])
    tot = tl.sum(tl.sum(acc, axis=1) ^ tl.sum(acc_t, axis=1), axis=0)
    tl.store(out_ptr + pid, tot)


def main() -> None:
    torch.manual_seed(0)
    B, top_k = 128, 2048
    tokens = B * 8192
    n = B * top_k
    kv = torch.randint(-2 ** 31, 2 ** 31 - 1, (tokens, 144), dtype=torch.int32, device="cuda")
    idx_random = torch.randint(0, tokens, (n,), dtype=torch.int32, device="cuda")
    idx_seq = torch.arange(n, dtype=torch.int32, device="cuda")
    nbytes = n * 576
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    cases = {"copy 1 GiB": lambda: dst.copy_(src)}
    outs = {}
    for rows, r, warps in ((2048, 64, 8), (256, 32, 4), (128, 32, 4), (64, 16, 4), (64, 64, 8), (32, 32, 4)):
        out = outs.setdefault(rows, torch.empty(n // rows, dtype=torch.int32, device="cuda"))
        for name, idx in (("random", idx_random), ("sequential", idx_seq)):
            if name == "sequential" and rows != 64:
                continue
            cases[f"{name} rows/prog {rows} R {r} w{warps}"] = (
                lambda idx=idx, out=out, rows=rows, r=r, warps=warps:
                gather_rows_kernel[(n // rows,)](kv, idx, out, ROWS=rows, R=r, num_warps=warps))
    for fn in cases.values():
        fn()
    torch.cuda.synchronize()
    times = time_interleaved(cases, rounds=5, iters=40)
    copy_rate = 2 * (1 << 30) / (times["copy 1 GiB"] * 1e-6) / 1e9
    print(f"{torch.cuda.get_device_name()}: copy {copy_rate:.0f} GB/s (1 GiB copy_, read + write, interleaved); "
          f"gathered {nbytes / 1e6:.0f} MB")
    print("\n".join(bandwidth_lines({k: t for k, t in times.items() if not k.startswith("copy")}, nbytes, copy_rate)))


if __name__ == "__main__":
    main()
