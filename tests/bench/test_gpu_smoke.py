"""bench/gpu/gpu_smoke.py, the GPU smoke check, on a machine without a GPU: the report names every step with its
status and reason, a step runs under its timeout (its whole process group killed), what a step needs is
read from the import probe, and the probes' code runs on a CPU (so the first GPU minutes are not spent on
a Python error)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gpu import gpu_smoke
from bench.gpu.gpu_smoke import STATUSES, STEPS, Step, missing, run_step

ROOT = Path(__file__).resolve().parents[2]


def test_the_report_has_every_step_with_its_status_and_reason(tmp_path):
    """Only the import probe selected (seconds): every other step is in the report, skipped, saying why."""
    report = tmp_path / "smoke.json"
    done = subprocess.run([sys.executable, "bench/gpu/gpu_smoke.py", "--report", str(report), "--steps", "imports"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rep = json.loads(report.read_text())
    steps = rep["steps"]
    assert [s["name"] for s in steps] == [s.name for s in STEPS]
    for s in steps:
        assert s["status"] in STATUSES and isinstance(s["reason"], str) and s["reason"].strip(), s
    probe = steps[0]
    assert probe["status"] == "passed" and probe["figures"]["torch"] and rep["machine"] == probe["figures"]
    for step, s in zip(STEPS[1:], steps[1:]):
        assert s["status"] == "skipped"
        if "cuda" in step.needs and not rep["machine"]["cuda"]:
            assert s["reason"].startswith("needs CUDA"), s
        elif missing(step, rep["machine"]) is None:
            assert s["reason"] == "not selected (--steps)"
    table = report.with_suffix(".md").read_text()
    assert table.strip() == done.stdout.strip() and all(f"| {s.name} | " in table for s in STEPS)


def test_a_step_past_its_timeout_is_killed_with_its_children(tmp_path):
    child = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(child)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    rec = run_step([sys.executable, "-c", code], timeout_s=3)
    assert rec["status"] == "timeout" and "timeout of 3 s" in rec["reason"] and "started" in rec["tail"]
    assert time.monotonic() - t0 < 30
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the step's child outlived its timeout"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is dead, not yet reaped
    except FileNotFoundError:
        return False


def test_results_failures_and_pytest_counts_are_read_from_the_output():
    ok = run_step([sys.executable, "-c", "print('SMOKE {\"summary\": \"3 GB staged\", \"gb\": 3}')"], timeout_s=60)
    assert (ok["status"], ok["reason"], ok["figures"]["gb"]) == ("passed", "3 GB staged", 3)
    bad = run_step([sys.executable, "-c", "import sys; print('working'); sys.exit('boom: 2 broadcasts, 8 expected')"],
                   timeout_s=60)
    assert bad["status"] == "failed" and bad["reason"] == "exit status 1: boom: 2 broadcasts, 8 expected"
    tests = run_step([sys.executable, "-c", "print('SKIPPED [2] tests/x.py:13: needs CUDA'); "
                      "print('12 passed, 2 skipped in 2.68s')"], timeout_s=60)
    assert tests["reason"] == "12 passed, 2 skipped (skipped: needs CUDA)"
    assert tests["figures"]["pytest"] == {"passed": 12, "skipped": 2}


def test_what_a_step_needs_is_read_from_the_import_probe():
    step = Step("s", "", ("torch", "cuda", "transformers"), 10, ())
    gpu = {"torch": "2.13.0", "cuda": True, "executable": "/usr/bin/python3",
           "packages": {"transformers": {"dist": "transformers", "version": "5.19.0"}}}
    assert missing(step, gpu) is None
    assert missing(step, {**gpu, "cuda": False}).startswith("needs CUDA: torch 2.13.0 sees no GPU")
    assert missing(step, {**gpu, "packages": {"transformers": None}}) == \
        "needs transformers: not installed for /usr/bin/python3"
    assert "did not finish" in missing(step, None)
    assert missing(Step("imports", "", (), 10, ()), None) is None


def test_the_budget_leaves_out_steps_that_would_not_fit(monkeypatch):
    """A step is not started with less of the budget left than it needs: it is skipped, saying so."""
    ran = []

    def fake(argv, timeout_s, cwd=ROOT):
        ran.append(timeout_s)
        every = {n: {"dist": n, "version": "1.0"} for s in STEPS for n in s.needs}  # a GPU machine with it all
        figures = {"torch": "2.13.0", "cuda": True, "packages": every, "summary": "probe"} if "imports" in argv[1] else {}
        return {"status": "passed", "reason": "ok", "seconds": 0.0, "figures": figures, "tail": ""}

    monkeypatch.setattr(gpu_smoke, "run_step", fake)
    rep = gpu_smoke.run({"imports", "overlap_c1"}, budget_s=40, log=lambda m: None)
    by = {s["name"]: s for s in rep["steps"]}
    assert by["overlap_c1"]["status"] == "passed" and ran[1] <= 40  # its timeout is cut to what is left
    assert by["staging_7b"]["reason"] == "not selected (--steps)"
    late = gpu_smoke.run({s.name for s in STEPS}, budget_s=10, log=lambda m: None)["steps"]
    assert late[0]["status"] == "passed" and ran[-1] <= 10  # the import probe always runs
    assert late[1]["reason"].startswith("no time left: 10 s of the 10 s budget") and late[1]["status"] == "skipped"


@pytest.mark.parametrize("probe, argv", [
    ("gpu_smoke_c1", ["--device", "cpu", "--weight", "128", "--matrix", "256", "--matmuls", "10", "--sleep-s", "0.05"]),
    ("gpu_smoke_staging", ["--device", "cpu", "--shape", "tiny"]),
    ("gpu_smoke_memory", ["--device", "cpu", "--shape", "tiny", "--tokens", "64", "--chunk", "32"]),
])
def test_each_probe_runs_its_code_on_a_cpu(probe, argv, capsys):
    import importlib

    assert importlib.import_module(f"bench.gpu.{probe}").main(argv) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("SMOKE ")][-1]
    assert json.loads(line[6:])["summary"]


def test_the_7b_shapes_are_qwen25_7b():
    """339 tensors, 7 615 616 512 parameters = 15.23 GB in bf16 (the figures weightsync/staging.py and the
    memory estimate use): embeddings 2 × 152064 × 3584 + 28 layers × (q 3584² + k, v 2 × 512 × 3584 + o 3584²
    + MLP 3 × 18944 × 3584 + biases 3584 + 2 × 512 + norms 2 × 3584) + the final norm 3584."""
    import math

    from bench.gpu.gpu_smoke_staging import qwen2_tensors

    tensors = qwen2_tensors(gpu_smoke.MODEL_CONFIGS["7b"])
    assert len(tensors) == 339 and sum(math.prod(s) for _, s in tensors) == 7_615_616_512
