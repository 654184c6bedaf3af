"""The tensor-parallel example runs on 2 CPU processes (gloo) and matches one process.

The example itself asserts that every rank holds the same all-reduced result, that it
matches a single-process run of all heads, and that it matches the layer computed in fp32
without FP8 quantization; this test launches it with torchrun and checks it reported so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests._markers import interpreter_only

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tp_sparse_mla_decode.py"


@interpreter_only  # GPUs hidden, ranks under the interpreter: a CPU-machine test (on GPUs: the x2 TP benchmark)
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
@pytest.mark.timeout(120)
def test_tp_example_two_gloo_ranks():
    # CPU tensors (gloo) even on a GPU machine; the kernels run under Triton's interpreter
    env = {**os.environ, "MATE_BACKEND": "triton", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
           "--batch", "3", "--heads", "4"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "world_size=2, 2 heads per rank" in proc.stdout, log[-4000:]
    assert "relative difference to one process" in proc.stdout
    assert "relative difference to the unquantized fp32 layer" in proc.stdout
    assert proc.stdout.strip().endswith("ok"), log[-4000:]


@interpreter_only
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
@pytest.mark.timeout(120)
def test_tp_example_without_torchrun_runs_one_rank():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env.update({"MATE_BACKEND": "triton", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)})
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--batch", "2", "--heads", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=110)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "world_size=1, 2 heads per rank" in proc.stdout, log[-4000:]
    assert proc.stdout.strip().endswith("ok"), log[-4000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.skipif(not dist.is_available() or not dist.is_nccl_available(), reason="needs torch.distributed nccl")
@pytest.mark.timeout(300)
def test_tp_example_two_nccl_ranks():
    """Two GPUs, one rank each, NCCL all-reduce (NVLink multicast kept off), DeepSeek-V3.2 sizes."""
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
           "--deepseek", "--batch", "8"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=290)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "world_size=2, 64 heads per rank" in proc.stdout, log[-4000:]
    assert "device=cuda" in proc.stdout, log[-4000:]
    assert proc.stdout.strip().endswith("ok"), log[-4000:]
