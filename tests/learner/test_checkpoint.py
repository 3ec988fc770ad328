"""Checkpoints: sharded exact-resume state, the commit marker, rotation, and HF exports that transformers
and vLLM load."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from launch.state.position import RunPosition
from launch.state.run_checkpoints import RunCheckpoints
from learner import checkpoint
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups


def _hf_prompt_logprobs(model_dir, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    x = torch.tensor([ids])
    with torch.no_grad():
        return torch.log_softmax(model(x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]


def _hf_weights(model_dir) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return {n: v.detach() for n, v in model.named_parameters()}


def _save(learner: Learner, root: Path, step: int, extra: dict | None = None) -> Path:
    """What the driver does: stage, let the learner write its part, commit."""
    staged = checkpoint.stage(root / f"step_{step}")
    learner.save(staged, extra)
    return checkpoint.commit(staged, root / f"step_{step}")


def test_resume_continues_the_same_trajectory(tiny_dir, tokenizer, tmp_path):
    """PRIME (policy + frozen reference + trainable PRM): save after 2 steps, then steps 3..5 of a
    resumed learner equal those of the uninterrupted one — losses, PRM version and all weights. The
    checkpoint's HF export holds the step-2 weights and the tokenizer."""
    cfg = make_cfg("prime", learner={"lr_schedule": "cosine", "warmup_steps": 2, "steps": 6},
                   prime={"prm_lr": 1e-3, "update": "double"})
    data = [make_groups(tokenizer, 2, 4, version=s, seed=s) for s in range(5)]
    a = Learner(cfg, 0, 1, tiny_dir)
    for s in range(2):
        a.step(data[s], version=s)
    ckpt = _save(a, tmp_path / "checkpoints", 2, {"buffer_snapshot": "buf/000002.msgpack", "cursor": 17})
    saved = full_weights(a)
    tail_a = [a.step(data[s], version=s) for s in range(2, 5)]
    weights_a = full_weights(a)

    export = checkpoint.export_hf(ckpt, tmp_path / "hf" / "step_2")
    assert sorted(p.name for p in export.glob("*.safetensors")) == ["model.safetensors"]
    for name, value in _hf_weights(export).items():
        np.testing.assert_array_equal(value.double().numpy(), saved[name], err_msg=name)
    assert AutoTokenizer.from_pretrained(export).get_vocab() == tokenizer.get_vocab()
    assert list((ckpt / "prime_prm" / "shards").glob("shard-*.safetensors"))
    assert checkpoint.latest_checkpoint(tmp_path / "checkpoints") == ckpt

    b = Learner(cfg, 0, 1, tiny_dir)
    extra = b.load(ckpt)
    assert extra == {"buffer_snapshot": "buf/000002.msgpack", "cursor": 17}
    # the counters a resume continues: 2 optimiser steps (the LR schedule's clock) and 2 PRM updates
    # (the weight version is the driver's: extra_state's "step")
    assert (b.optimizer_steps, b.providers["prime_q"].version) == (2, 2)
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
    initial = full_weights(learner)
    root = tmp_path / "checkpoints"
    zero = _save(learner, root, 0)
    # no optimiser state before the first step, and saving made none (torch's state-dict API would
    # have run a zero-gradient step, leaving AdamW's step counter at 1)
    assert not learner.opt.state
    groups = make_groups(tokenizer, 1, 4)
    learner.step(groups, 0)
    first = _save(learner, root, 1, {"cursor": 1})
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    learner.step(groups, 1)

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint, "save_rng", boom)
    with pytest.raises(OSError, match="disk full"):
        _save(learner, root, 2, {"cursor": 2})
    with pytest.raises(OSError, match="disk full"):
        _save(learner, root, 1, {"cursor": 2})  # re-saving an existing step fails too...
    assert checkpoint.latest_checkpoint(root) == first  # ...and the old one is untouched
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    monkeypatch.undo()
    with pytest.raises(FileExistsError, match="not empty"):
        learner.save(first)
    learner.save(root / "step_3")  # the learner's part only, never committed: not a checkpoint
    assert checkpoint.latest_checkpoint(root) == first
    assert Learner(make_cfg("grpo"), 0, 1, tiny_dir).load(first) == {"cursor": 1}
    _save(learner, root, 2, {"cursor": 2})
    assert checkpoint.rotate(root, keep=0) == []  # sweeps what the crashes left (.step_<N>.tmp)
    assert sorted(p.name for p in root.iterdir()) == ["step_0", "step_1", "step_2", "step_3"]
    assert checkpoint.latest_checkpoint(root) == root / "step_2"
    assert learner.opt.state
    learner.load(zero)  # back to the start: weights, and no optimiser state
    assert not learner.opt.state and learner.optimizer_steps == 0
    for k, v in full_weights(learner).items():
        np.testing.assert_array_equal(v, initial[k], err_msg=k)


class _Graph:
    """The learner side of the process graph; `crash` kills the driver right after the learner's save."""

    def __init__(self, learner: Learner):
        self.learner, self.crash = learner, False

    def save(self, path: Path, extra_state: dict) -> None:
        self.learner.save(path, extra_state)
        if self.crash:
            raise SystemExit("driver killed after the learner's save")

    def load(self, path: Path) -> dict:
        return self.learner.load(path)


class _Buffer:
    restored = None

    def snapshot(self, path: str) -> None:
        Path(path).write_bytes(b"buffer snapshot")

    def stats(self) -> dict:  # nothing discarded since the last pull
        return {"discarded_pending": []}

    def restore(self, path: str) -> None:
        self.restored = Path(path).read_bytes()

    def set_version(self, version: int) -> None:
        self.version = version


def _checkpoints(run_dir: Path, learner: Learner, keep: int) -> RunCheckpoints:
    """The driver's checkpoints only: no buffer service, no actors."""
    client = _Buffer()
    buffer = SimpleNamespace(client=client, held_prompts=lambda: [], call_on_live_buffer=lambda call: call(client))
    return RunCheckpoints(run_dir, _Graph(learner), buffer, RunPosition(), SimpleNamespace(message=lambda text: None),
                          keep=keep)


def test_driver_commits_after_the_buffer_snapshot_and_rotates(tiny_dir, tmp_path):
    """A checkpoint counts once everything is in it: a driver killed after the learner's save (before the
    buffer snapshot) leaves none — the old order (learner_state.json, then the snapshot moved in) left
    one without its buffer. Rotation keeps the newest `keep_checkpoints` plus the one resumed from."""
    d = _checkpoints(tmp_path, Learner(make_cfg("grpo"), 0, 1, tiny_dir), keep=2)
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        d.position.step = step
        d.save(export=step == 3)
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_3"]
    last = checkpoint.latest_checkpoint(root)
    assert last == root / "step_3" and (last / "buffer.msgpack").read_bytes() == b"buffer snapshot"
    # each value recorded once: the driver's position (learner steps = the weight version) and the
    # learner's counters and algorithm
    assert json.loads((last / "extra_state.json").read_text()).keys() == {"step", "ledger", "buffer_snapshot"}
    assert json.loads((last / "extra_state.json").read_text())["step"] == 3
    learner_state = json.loads((last / checkpoint.STATE_FILE).read_text())
    assert learner_state.keys() == {"format", "algo", "optimizer_steps", "skipped_steps", "world_size", "providers"}
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["step_3"]  # only where asked
    assert (tmp_path / "hf" / "step_3" / "config.json").is_file()

    d.position.step = 4
    d.graph.crash = True
    with pytest.raises(SystemExit):
        d.save()
    assert checkpoint.latest_checkpoint(root) == last
    d.graph.crash = False
    d.resumed_from = (root / "step_2",)
    d.position.step = 5
    d.save()  # keeps step_3 and step_5 (the newest 2) and step_2 (resumed from); sweeps .step_4.tmp
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_3", "step_5"]

    resumed = _checkpoints(tmp_path, Learner(make_cfg("grpo"), 0, 1, tiny_dir), keep=2)
    assert resumed.restore(tmp_path) == []  # no prompt trained or buffered in this fake run
    assert (resumed.position.step, resumed.resumed_from, resumed.recovery.client.restored) == (5, (root / "step_5",), b"buffer snapshot")


def test_optimizer_steps_are_read_from_older_checkpoints_too():
    """Format 3 names the optimiser steps `optimizer_steps`; formats 1-2 called them "step" (not the
    learner steps of extra_state.json) and recorded a "version" that is now the driver's alone."""
    assert checkpoint.optimizer_steps({"format": 3, "optimizer_steps": 8}) == 8
    assert checkpoint.optimizer_steps({"format": 2, "step": 8, "version": 2}) == 8
    with pytest.raises(ValueError, match="holds no optimizer_steps"):
        checkpoint.optimizer_steps({"format": 2})


def test_rotation_and_latest_count_committed_steps_by_number(tmp_path):
    for name in ("step_1", "step_2", "step_3", "step_10", "step_9", ".step_4.tmp"):
        (tmp_path / name).mkdir()
        if name in ("step_1", "step_2", "step_3", "step_10"):
            (tmp_path / name / checkpoint.COMMITTED).write_text(name)
    # step_9 has no marker: not a checkpoint; step_10 > step_3 numerically (not as strings)
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "step_10"
    assert checkpoint.rotate(tmp_path, keep=0) == []
    # committed 1, 2, 3, 10: the newest 2 are 3 and 10, step_1 is protected → only step_2 goes
    assert checkpoint.rotate(tmp_path, keep=2, protect=(tmp_path / "step_1",)) == [tmp_path / "step_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_10", "step_3", "step_9"]
    assert checkpoint.rotate(tmp_path, keep=1) == [tmp_path / "step_1", tmp_path / "step_3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10", "step_9"]


def test_export_in_the_serving_dtype_split_into_files(tiny_dir, tokenizer, tmp_path, monkeypatch):
    """bf16 export, capped at 64 KiB per file: several model-<i>-of-<n>.safetensors of bf16 tensors and an
    index, which transformers loads into the bf16-rounded checkpoint weights."""
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    learner.step(make_groups(tokenizer, 1, 4), 0)
    ckpt = _save(learner, tmp_path / "checkpoints", 1)
    monkeypatch.setattr(checkpoint, "EXPORT_SHARD_BYTES", 64 << 10)
    out = checkpoint.export_hf(ckpt, tmp_path / "hf", dtype=torch.bfloat16)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(files) > 1 and sorted(set(index["weight_map"].values())) == files
    saved = full_weights(learner)
    assert sorted(index["weight_map"]) == sorted(saved)  # tied lm_head stored once, as embed_tokens
    assert {t.dtype for f in files for t in load_file(str(out / f)).values()} == {torch.bfloat16}
    for name, value in _hf_weights(out).items():  # loaded in config.json's dtype (the run's, float32 here)
        assert torch.equal(value, torch.from_numpy(saved[name]).to(torch.bfloat16).to(value.dtype)), name


def test_loading_another_algorithms_checkpoint_is_an_error(tiny_dir, tokenizer, tmp_path):
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    path = learner.save(tmp_path / "step_0")
    with pytest.raises(ValueError, match="saved by a 'grpo' run"):
        Learner(make_cfg("sft"), 0, 1, tiny_dir).load(path)
    with pytest.raises(FileNotFoundError, match="not a complete learner checkpoint"):
        learner.load(tmp_path)


@pytest.mark.slow
def test_vllm_serves_the_export(tiny_dir, tokenizer, tmp_path):
    pytest.importorskip("vllm")
    cfg = make_cfg("sft", learner={"lr": 3e-2})  # a big step, so trained and initial weights differ
    learner = Learner(cfg, 0, 1, tiny_dir)
    learner.step(make_groups(tokenizer, 2, 4), 0)
    export = checkpoint.export_hf(_save(learner, tmp_path / "checkpoints", 1), tmp_path / "hf" / "step_1")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], tokenize=False,
                                           add_generation_prompt=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_load_probe.py")), str(export), prompt],
                          capture_output=True, text=True, timeout=240, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("PROBE_RESULT "))
    ids = result["prompt_token_ids"]
    assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"] and len(result["generated"]) >= 1
    vllm_lp = torch.tensor(result["prompt_logprobs"][1:])
    torch.testing.assert_close(vllm_lp, _hf_prompt_logprobs(export, ids), atol=1e-3, rtol=1e-3)
    assert (vllm_lp - _hf_prompt_logprobs(tiny_dir, ids)).abs().max() > 1e-2  # the trained weights were served
