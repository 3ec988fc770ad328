"""Checkpoints: HF directories that transformers and vLLM load, atomic writes, and exact resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from learner import checkpoint
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups


def _hf_prompt_logprobs(model_dir, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    x = torch.tensor([ids])
    with torch.no_grad():
        return torch.log_softmax(model(x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]


def test_resume_continues_the_same_trajectory(tiny_dir, tokenizer, tmp_path):
    """PRIME (policy + frozen reference + trainable PRM): save after 2 steps, then steps 3..5 of a
    resumed learner equal those of the uninterrupted one — losses, PRM version and all weights."""
    cfg = make_cfg("prime", learner={"lr_schedule": "cosine", "warmup_steps": 2, "steps": 6},
                   prime={"prm_lr": 1e-3, "update": "double"})
    data = [make_groups(tokenizer, 2, 4, version=s, seed=s) for s in range(5)]
    a = Learner(cfg, 0, 1, tiny_dir)
    for s in range(2):
        a.step(data[s], version=s)
    ckpt = a.save(tmp_path / "checkpoints" / "step_2", {"buffer_snapshot": "buf/000002.msgpack", "cursor": 17})
    saved = full_weights(a)
    tail_a = [a.step(data[s], version=s) for s in range(2, 5)]
    weights_a = full_weights(a)

    # The directory is a plain HF model: transformers loads the weights saved at step 2.
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for name, value in hf.named_parameters():
        np.testing.assert_array_equal(value.detach().double().numpy(), saved[name], err_msg=name)
    assert AutoTokenizer.from_pretrained(ckpt).get_vocab() == tokenizer.get_vocab()
    assert (ckpt / "prime_prm" / "model.safetensors").is_file()
    assert checkpoint.latest_checkpoint(tmp_path / "checkpoints") == ckpt

    b = Learner(cfg, 0, 1, tiny_dir)
    extra = b.load(ckpt)
    assert extra == {"buffer_snapshot": "buf/000002.msgpack", "cursor": 17}
    assert (b.step_count, b.version, b.providers["prime_q"].version) == (2, 2, 2)
    tail_b = [b.step(data[s], version=s) for s in range(2, 5)]
    for ma, mb in zip(tail_a, tail_b):
        for k in ("loss/total", "optim/grad_norm", "optim/lr", "prime/prm_loss", "prime/prm_version", "prime/q_mean"):
            assert ma[k] == mb[k], (k, ma[k], mb[k])
    # warm-up 2 steps, then cosine with p = (step − 2)/4: steps 2, 3, 4 → peak·½(1 + cos πp)
    # = peak·(1, ½(1 + cos π/4) = 0.853553, ½)
    assert [m["optim/lr"] for m in tail_b] == pytest.approx([1e-3, 0.853553e-3, 0.5e-3], rel=1e-6)
    assert tail_b[-1]["prime/prm_version"] == 5.0
    weights_b = full_weights(b)
    for k in weights_a:
        np.testing.assert_array_equal(weights_a[k], weights_b[k], err_msg=k)
    assert max(float(np.abs(weights_a[k] - saved[k]).max()) for k in saved) > 1e-4  # it did train


def test_crash_mid_save_leaves_previous_checkpoint(tiny_dir, tokenizer, tmp_path, monkeypatch):
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    groups = make_groups(tokenizer, 1, 4)
    learner.step(groups, 0)
    root = tmp_path / "checkpoints"
    first = learner.save(root / "step_1", {"cursor": 1})
    before = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    learner.step(groups, 1)

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint, "save_rng", boom)
    with pytest.raises(OSError, match="disk full"):
        learner.save(root / "step_2", {"cursor": 2})
    with pytest.raises(OSError, match="disk full"):
        learner.save(root / "step_1", {"cursor": 2})  # overwriting an existing checkpoint fails too...
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]  # no partial step_2, temp dirs removed
    assert checkpoint.latest_checkpoint(root) == first  # ...and the old one is untouched
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()} == before
    monkeypatch.undo()
    assert Learner(make_cfg("grpo"), 0, 1, tiny_dir).load(first) == {"cursor": 1}
    (root / ".step_3.tmp").mkdir()  # what a killed process leaves behind
    assert checkpoint.latest_checkpoint(root) == first
    learner.save(root / "step_2", {"cursor": 2})  # a later save sweeps leftovers up
    assert checkpoint.latest_checkpoint(root) == root / "step_2"
    assert sorted(p.name for p in root.iterdir()) == ["step_1", "step_2"]


def test_loading_another_algorithms_checkpoint_is_an_error(tiny_dir, tokenizer, tmp_path):
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    path = learner.save(tmp_path / "step_0")
    with pytest.raises(ValueError, match="saved by a 'grpo' run"):
        Learner(make_cfg("sft"), 0, 1, tiny_dir).load(path)
    with pytest.raises(FileNotFoundError, match="not a complete learner checkpoint"):
        learner.load(tmp_path)


@pytest.mark.slow
def test_vllm_serves_the_checkpoint(tiny_dir, tokenizer, tmp_path):
    pytest.importorskip("vllm")
    cfg = make_cfg("sft", learner={"lr": 3e-2})  # a big step, so trained and initial weights differ
    learner = Learner(cfg, 0, 1, tiny_dir)
    learner.step(make_groups(tokenizer, 2, 4), 0)
    ckpt = learner.save(tmp_path / "step_1")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], tokenize=False,
                                           add_generation_prompt=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_load_probe.py")), str(ckpt), prompt],
                          capture_output=True, text=True, timeout=240, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("PROBE_RESULT "))
    ids = result["prompt_token_ids"]
    assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"] and len(result["generated"]) >= 1
    vllm_lp = torch.tensor(result["prompt_logprobs"][1:])
    torch.testing.assert_close(vllm_lp, _hf_prompt_logprobs(ckpt, ids), atol=1e-3, rtol=1e-3)
    assert (vllm_lp - _hf_prompt_logprobs(tiny_dir, ids)).abs().max() > 1e-2  # the trained weights were served
