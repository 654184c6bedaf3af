#!/usr/bin/env bash
# The full GPU session on one H200 (used through the device tool): peer wheels, the GPU
# runner (ceilings, `pytest -m gpu`, every benchmark) and compute-sanitizer memcheck on the
# adversarial-index scripts. Results go to $OUT (or benchmarks/results).
#   bash scripts/gpu_run.sh [extra run_gpu.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD:$PWD/wrappers/flashinfer" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 benchmarks/run_gpu.py "$@"
rc=$?
for script in benchmarks/sanitize_sparse_mla.py benchmarks/sanitize_msa_attention.py benchmarks/sanitize_gemm.py; do
    [ -f "$script" ] || continue
    echo "== compute-sanitizer memcheck $script" | tee -a "$OUT_DIR/sanitize.log"
    timeout "${SANITIZE_TIMEOUT:-120}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 "$script" \
        >> "$OUT_DIR/sanitize.log" 2>&1
    echo "   exit code $?" | tee -a "$OUT_DIR/sanitize.log"
    grep -E "ERROR SUMMARY" "$OUT_DIR/sanitize.log" | tail -1
done
exit $rc
