#!/usr/bin/env bash
# Installs mate (editable, with the test, bench and docs extras) and its pinned CPU toolchain when no CUDA
# build of torch is present: torch 2.13.0, triton 3.6.0 (the GPU machines' version) and
# numpy < 2.4 (triton 3.6's interpreter fails with numpy 2.4).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    python -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
fi
python -m pip install -q -e ".[test,bench,docs]"
if [ -f wrappers/flashinfer/pyproject.toml ]; then
    python -m pip install -q --no-deps -e wrappers/flashinfer
fi
