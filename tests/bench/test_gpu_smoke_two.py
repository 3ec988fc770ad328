"""bench/gpu/gpu_smoke_two.py, the two-GPU part of the smoke check, on a machine without two GPUs: it runs, every step
is in the report, and each one that needs two GPUs is skipped saying so (seconds: only the import probe runs)."""

import json
import subprocess
import sys
from pathlib import Path

from bench.gpu.gpu_smoke_two import STEPS, needs_two

ROOT = Path(__file__).resolve().parents[2]


def test_it_runs_and_skips_with_the_reason_where_there_are_not_two_gpus(tmp_path):
    report = tmp_path / "smoke2.json"
    done = subprocess.run([sys.executable, "bench/gpu/gpu_smoke_two.py", "--report", str(report), "--work",
                           str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    rep = json.loads(report.read_text())
    assert [s["name"] for s in rep["steps"]] == [s.name for s in STEPS]
    assert rep["steps"][0]["status"] == "passed"
    devices = rep["machine"]["devices"]
    if devices < 2:
        for s in rep["steps"][1:]:
            assert s["status"] == "skipped" and s["reason"].strip(), s
        assert any(s["reason"].startswith(("needs CUDA", "needs 2 CUDA devices")) for s in rep["steps"][1:])
    assert report.with_suffix(".md").read_text().startswith("GPU smoke, two GPUs (")


def test_two_devices_and_vllms_cuda_build_are_needed():
    push = next(s for s in STEPS if s.name == "push")
    probe = {"cuda": True, "devices": 1, "vllm_gpu_build": True, "executable": "python",
             "packages": {m: {"dist": m, "version": "1"} for m in ("vllm", "numpy", "transformers")}}
    assert needs_two(push, probe) == "needs 2 CUDA devices: torch sees 1"
    assert needs_two(push, {**probe, "devices": 2}) is None
    assert needs_two(push, {**probe, "devices": 2, "vllm_gpu_build": False}).startswith("needs vLLM's CUDA build")
