"""Helpers of the end-to-end tests: run `algo-train` for real, read what a run left behind, and find
the processes a run started (through its session: `launch.commands.supervisor` runs every run in a session of
its own, so another run on the same machine is never mistaken for this one)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

EXE = str(Path(sys.executable).with_name("algo-train"))
# The built-in tiny model without its 300-step SFT warm-up (minutes of a loaded 2-core machine): runs that check
# processes, not learning. Its groups are all-fail; a small entropy bonus moves the weights of RLOO/GRPO.
UNTRAINED = ["--set", "model.sft_warmup_steps=0", "--set", "loss.entropy_coef=0.01"]
SMALL = ["--set", "rollout.n=4", "--set", "learner.batch_prompts=4", "--set", "learner.micro_batch_samples=8",
         "--set", "rollout.max_response_tokens=48", "--set", "data.eval_prompts=8", "--set", "learner.eval_every=2",
         "--set", "data.train_prompts=2000", "--set", "learner.warmup_steps=0"]  # runs of 2-3 steps: no warm-up


def command(out: Path, model_cache: str | None, *args: str) -> list[str]:
    """The `algo-train` command line of a small test run writing to `out` (`args` come last, so their
    `--set`s override SMALL's). model_cache: the built-in model's cache; None for a run given --model."""
    cache = ["--set", f"model.cache_dir={model_cache}"] if model_cache else []
    return [EXE, "--output", str(out), *SMALL, *cache, "--set", "logging.progress=plain", *args]


def train(out: Path, model_cache: str | None, *args: str, timeout: int = 420) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_DEDUP_LOGS="1")
    proc = subprocess.run(command(out, model_cache, *args), capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        pytest.fail(f"algo-train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def rows(run: Path) -> list[dict]:
    """The metrics rows of `run` written so far: a live run may be half-way through writing its last line,
    so only complete lines (ending in a newline) are read."""
    path = run / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]


def trained_rows(run: Path) -> list[dict]:
    return [r for r in rows(run) if "loss/total" in r]


def check_run(run: Path, steps: int, max_staleness: int, key: str) -> list[dict]:
    train_rows = trained_rows(run)
    assert [r["step"] for r in train_rows] == list(range(1, steps + 1))
    for r in train_rows:
        assert r["loss/total"] is not None and math.isfinite(r["loss/total"]), r
        assert r["staleness/max"] <= max_staleness, f"a row above the staleness bound was trained: {r}"
        assert key in r and r[key] is not None, f"{key} missing from {sorted(r)}"
        # what users look at first (issue 32): entropy every step, response lengths of the generated rows
        assert r.get("entropy") is not None and r["entropy"] >= 0, r
        for k in ("response/length_mean", "response/length_max", "response/clipped_frac"):
            assert k in r and (r[k] is not None or r["accuracy/train"] is None), f"{k}: {r}"
    # every evaluation's per-prompt rewards (eval_prompts.jsonl) add up to its accuracy
    from launch.loop.metrics import read_eval_prompts

    evals = {r["step"]: r for r in rows(run) if r.get("eval/accuracy") is not None}
    per_prompt = read_eval_prompts(run)
    assert evals and sorted(per_prompt) == sorted(evals), (sorted(per_prompt), sorted(evals))
    for step, r in evals.items():
        assert len(per_prompt[step]) == r["eval/n"]
        assert sum(per_prompt[step].values()) / r["eval/n"] == pytest.approx(r["eval/accuracy"])
    return train_rows


def assert_keys_documented(run: Path) -> None:
    """Every key the run wrote to metrics.jsonl is in docs/metrics.md (loss components as `loss/<component>`)."""
    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`([^`]+)`", doc))
    written = {k for r in rows(run) for k in r}
    missing = sorted(k for k in written if k not in documented and not k.startswith("loss/"))
    assert not missing, f"metrics written but not in docs/metrics.md: {missing}"


def assert_weights_changed(run: Path, step: int, model_cache: str) -> None:
    """The final HF export's weights (hf/step_<step>) differ from the built-in model the run started from:
    its SFT warm-up when the cache holds one, else the untrained tiny model (runs with UNTRAINED)."""
    built = [d for d in Path(model_cache).iterdir() if d.is_dir() and not d.name.endswith(".partial")]
    warmed = [d for d in built if "-sft-" in d.name]
    (start,) = warmed or built
    assert_weights_changed_from(start, run, step)


def assert_weights_changed_from(start: Path, run: Path, step: int) -> None:
    """The final HF export's weights (hf/step_<step>) differ from those of the model directory `start`."""
    before = load_file(str(start / "model.safetensors"))
    after = load_file(str(run / "hf" / f"step_{step}" / "model.safetensors"))
    assert before.keys() == after.keys()
    # compared in the export's dtype (a bf16 run exports bf16: rounding alone must not count as a change)
    assert any(not (before[k].to(after[k].dtype) == after[k]).all() for k in before), \
        "training did not change the weights"


def ledger_state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step_{step}" / "extra_state.json").read_text())["ledger"]


def ledger(run: Path, step: int) -> list[tuple[int, int]]:
    """(epoch, prompt_index) of every prompt trained up to checkpoint `step`."""
    state = ledger_state(run, step)
    return list(zip(state["epochs"], state["prompts"]))


def processes() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, session id, command line) of every process on the machine."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,sid=,args="], capture_output=True, text=True).stdout
    procs = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3:
            procs.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3] if len(parts) > 3 else ""))
    return procs


def session_processes(sid: int) -> list[str]:
    return [f"{sid} {pid} {args}" for pid, _, s, args in processes() if s == sid]


def run_session(launcher_pid: int, timeout_s: float = 60.0) -> int:
    """Session id of the run started by the `algo-train` process `launcher_pid`: the pid of its
    `launch.commands.supervisor` child (started with a session of its own)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid, ppid, sid, args in processes():
            if ppid == launcher_pid and "launch.commands.supervisor" in args and sid == pid:
                return sid
        time.sleep(0.2)
    raise AssertionError(f"algo-train (pid {launcher_pid}) started no run session within {timeout_s:.0f} s")


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live descendant of `pid`."""
    procs = processes()
    children: dict[int, list[tuple[int, str]]] = {}
    for p, ppid, _, args in procs:
        children.setdefault(ppid, []).append((p, args))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_for_trained_rows(run: Path, n: int, proc: subprocess.Popen, log: Path, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if len(trained_rows(run)) >= n:
            return
        time.sleep(0.2)
    text = log.read_text() if log.exists() else ""
    raise AssertionError(f"the run did not train {n} steps (exit {proc.poll()}):\n{text[-4000:]}")


# our tags, the progress line (plain lines start with the time), our errors, continuation lines
OWN_LINE = re.compile(r"(\[[a-z]+\] |(\d\d:\d\d:\d\d )?step \d+/\d+ |algo-train: | )")


def assert_quiet_console(text: str) -> None:
    """The run's terminal carries our own messages only: no other program's warnings, log lines or
    progress bars (Triton, Ray, transformers, tqdm, FutureWarning ...; they go to run_dir/logs/)."""
    noise = [line for line in text.splitlines() if line.strip() and not OWN_LINE.match(line)]
    assert not noise, "other programs' output on the terminal:\n" + "\n".join(noise[:20])
