#!/usr/bin/env bash
# Sets up mate (and the flashinfer wrapper) and runs the CPU test suite: kernels run under
# Triton's interpreter. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python -m ruff check .
# the docs: guides + API reference from the docstrings, warnings as errors
python -m sphinx -E -W --keep-going -q -b html docs docs/_build/html
export TRITON_INTERPRET=1
set +e
python -m pytest -n 2 --timeout 600 -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
