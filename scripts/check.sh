#!/usr/bin/env bash
# The whole test suite, as CI runs it: lint, format, types, tests (Triton kernels run interpreted on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
"$bin/ruff" check src tests docs benchmarks
"$bin/ruff" format --check src tests docs benchmarks
"$bin/mypy"
"$bin/python" -m pytest src tests docs "$@"
