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

It is also the suite's LoRA run (`model.lora`, issue 41): the adapters train on the frozen base, every push carries
the adapter alone (`model.lora.sync: adapter`, served by vLLM's LoRA; tests/actors/test_actor_adapters.py proves the
per-request pinning), the checkpoint holds the adapters only, and the run's output is a peft adapter (plus the
merged model) that peft and transformers load. The same command with one more step then resumes: the new engine
starts from the base labelled with the checkpoint's version, and the resume's first push brings it that adapter.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from tasks.tiny_model import build_tiny_model
from tests.e2e.helpers import (
    UNTRAINED,
    assert_keys_documented,
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


def test_serial_lora_trains_in_the_driver_process_without_ray_and_resumes(tmp_path):
    out, log = tmp_path / "serial", tmp_path / "serial.log"
    snapshot = hub_cache(tmp_path / "hf-hub", "org/tiny", build_tiny_model(tmp_path / "tiny"))
    guess = write_examples(tmp_path)["guess.py"]
    args = ["--algo", "pacs", "--serial", "--actors", "1", "--max-staleness", "1",
            "--model", "org/tiny", "--set", "data.system_prompt=Be exact.", "--set", "logging.samples_every=1",
            "--set", f"env.environment={guess}:Guess", "--set", "env.max_turns=3", "--set", "env.max_turn_tokens=12",
            "--set", "model.lora.rank=8", "--set", "model.lora.alpha=16", "--set", "model.lora.export_merged=true",
            *UNTRAINED]
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hf-hub"))
    seen: set[tuple[int, str]] = set()  # (pid, command line), every state sampled
    with open(log, "w") as sink:
        proc = subprocess.Popen(command(out, None, "--steps", "2", *args), stdout=sink, stderr=subprocess.STDOUT,
                                text=True, env=env)
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
    check_lora_outputs(out, snapshot, 2)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"].startswith("Be exact.") for s in samples), samples  # special tokens dropped
    assert any("try again" in s["response"] for s in samples), samples  # the environment's observation, masked
    # env/* are the actors' counts as of the driver's last health check (every 5 s, docs/metrics.md): a 2-step run
    # has them in a row only once a check came before it
    env_rows = [r for r in trained_rows(out) if "env/turns_mean" in r]
    assert env_rows, trained_rows(out)
    assert env_rows[-1]["env/turns_mean"] > 1 and env_rows[-1]["env/errors"] == env_rows[-1]["env/timeouts"] == 0

    assert any("VLLM::EngineCore" in args for _, args in seen), f"no vLLM engine seen in the run: {seen}"
    ray = {(pid, args[:200]) for pid, args in seen if any(m in args for m in RAY_MARKERS)}
    assert not ray, f"--serial started Ray processes: {ray}"
    assert "Ray" not in text, text[-3000:]
    assert "waitForInput" not in text, "c10d polling chatter (TORCH_CPP_LOG_LEVEL not applied)"

    # The same command with one more step resumes (a Slurm requeue): the new engine starts from the base, labelled
    # 2, and the resume's first push brings it adapter 2 before any request (under K = 1 step 3 needs version >= 2)
    pushed = [r["weight_sync/bytes"] for r in trained_rows(out) if r.get("weight_sync/bytes")]
    again = subprocess.run(command(out, None, "--steps", "3", *args), capture_output=True, text=True, timeout=600,
                           env=env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-5000:]
    assert "holds this command's run" in again.stdout + again.stderr
    check_run(out, 3, 1, "pacs/bce")
    assert all(r["weight_sync/bytes"] == pushed[0] for r in trained_rows(out) if r.get("weight_sync/bytes"))
    check_lora_outputs(out, snapshot, 3)


def check_lora_outputs(out, base_dir, step: int) -> None:
    """The checkpoint holds the adapters only; every push so far was the adapter alone (in the serving dtype, fp32 on
    CPU: wire bytes = the adapter's + framing); the export at `step` is a peft adapter that moves the base's logits
    and a merged model equal to it, whose changed weights are the adapted projections only."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = load_file(str(base_dir / "model.safetensors"))
    names, adapter_bytes = [], 0
    for f in (out / "checkpoints" / f"step_{step}" / "policy").glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names += list(h.keys())  # noqa: SIM118 (not a dict)
            adapter_bytes += sum(math.prod(h.get_slice(n).get_shape()) * 4 for n in h.keys()  # noqa: SIM118
                                 if n.startswith("model.") and ".lora_" in n)
    assert names and all(".lora_" in n for n in names if not n.endswith(".step")), names  # adapters only
    pushed = [r["weight_sync/bytes"] for r in trained_rows(out) if r.get("weight_sync/bytes")]
    full_bytes = sum(t.numel() * t.element_size() for t in base.values())
    assert pushed and all(adapter_bytes <= b < adapter_bytes * 1.05 < full_bytes for b in pushed), \
        (pushed, adapter_bytes, full_bytes)

    export = out / "hf" / f"step_{step}"
    assert (export / "adapter_config.json").is_file() and (export / "adapter_model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42, 9, 7, 3]])
    with torch.no_grad():
        plain = model(ids).logits
        adapted = PeftModel.from_pretrained(model, export).eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(export / "merged", dtype=torch.float32)(ids).logits
    assert (adapted - plain).abs().max() > 0  # the adapters trained
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    changed = {k for k, v in load_file(str(export / "merged" / "model.safetensors")).items()
               if not torch.equal(v, base[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed), changed  # the adapted layers only
