"""End to end: `algo-train --serial` trains with the learner and the actor in the driver process, without
Ray (only the buffer service and vLLM's engine processes are subprocesses). The algorithm is PACS: this is
the suite's PACS run (its config crossing to Ray processes: tests/configs/test_config_pickles.py).

Every process of the run's session is sampled while it runs: a vLLM engine must show up (so the
sampling sees the run) and nothing of Ray may (no `ray::` worker, no GCS server, no raylet).

The model is given as a user of the field gives one: a Hub id (`--model org/tiny`) found in the local HF
cache (HF_HUB_CACHE, `tests.hub_cache`: the untrained tiny model), so the learner and vLLM load the cache's
snapshot (symlinks to blobs); and the prompts carry a system prompt (`data.system_prompt`), which the
logged samples show.

Its rollouts take turns (issue 39): the environment class of docs/running.md "Tools and environments" (`Guess`,
taken from the page) answers each turn, turns are cut at 12 tokens so the untrained model's turns go on, and
the run's env/* metrics show several turns per trajectory and no fault.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml

from tasks.tiny_model import build_tiny_model
from tests.e2e.helpers import (
    UNTRAINED,
    assert_keys_documented,
    assert_weights_changed_from,
    check_run,
    command,
    processes,
    run_session,
    trained_rows,
)
from tests.envs.test_docs_examples import write_examples
from tests.hub_cache import hub_cache

pytestmark = pytest.mark.slow

RAY_MARKERS = ("ray::", "gcs_server", "raylet", "/ray/", "ray.util", "default_worker.py")


def test_serial_trains_in_the_driver_process_without_ray(tmp_path):
    out, log = tmp_path / "serial", tmp_path / "serial.log"
    snapshot = hub_cache(tmp_path / "hf-hub", "org/tiny", build_tiny_model(tmp_path / "tiny"))
    guess = write_examples(tmp_path)["guess.py"]
    cmd = command(out, None, "--algo", "pacs", "--serial", "--actors", "1", "--steps", "2", "--max-staleness", "1",
                  "--model", "org/tiny", "--set", "data.system_prompt=Be exact.", "--set", "logging.samples_every=1",
                  "--set", f"env.environment={guess}:Guess", "--set", "env.max_turns=3",
                  "--set", "env.max_turn_tokens=12", *UNTRAINED)
    seen: set[tuple[int, str]] = set()  # (pid, command line), every state sampled
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hf-hub")))
    try:
        sid = run_session(proc.pid)
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= {(pid, args) for pid, _, s, args in processes() if s == sid}
            time.sleep(0.3)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    check_run(out, 2, 1, "pacs/bce")
    assert_keys_documented(out)
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["path"] == str(snapshot)
    assert_weights_changed_from(snapshot, out, 2)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"].startswith("Be exact.") for s in samples), samples  # special tokens dropped
    assert any("try again" in s["response"] for s in samples), samples  # the environment's observation, masked
    last = trained_rows(out)[-1]
    assert last["env/turns_mean"] > 1 and last["env/errors"] == last["env/timeouts"] == 0, last

    assert any("VLLM::EngineCore" in args for _, args in seen), f"no vLLM engine seen in the run: {seen}"
    ray = {(pid, args[:200]) for pid, args in seen if any(m in args for m in RAY_MARKERS)}
    assert not ray, f"--serial started Ray processes: {ray}"
    assert "Ray" not in text, text[-3000:]
    assert "waitForInput" not in text, "c10d polling chatter (TORCH_CPP_LOG_LEVEL not applied)"
