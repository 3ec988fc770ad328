"""LoRA on the policy (`model.lora`, `learner.lora`): a frozen base with trained adapters, the reference = the base
with the adapters off, adapter-only checkpoints with exact resume (one rank and two gloo FSDP2 ranks), and an
export that peft, transformers and (merged) any HF loader read."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from learner.batching import rows_from_groups
from learner.checkpoint import export_hf
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups
from tests.learner.local_ranks import LearnerGroup

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _cfg(**lora):
    return make_cfg("grpo", model={"lora": {**LORA, **lora}}, loss={"kl_coef": 0.1}, learner={"batch_prompts": 2})


def _data(tokenizer, steps: int):
    return [make_groups(tokenizer, 2, 4, version=s, seed=s) for s in range(steps)]


def test_adapters_train_on_a_frozen_base_and_the_reference_is_the_base(tiny_dir, tokenizer):
    cfg = _cfg(sync="merged")  # pushes carry the merged model: the weights below are what engines would serve
    learner = Learner(cfg, 0, 1, tiny_dir)
    base = {k: v.double().numpy() for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
    # only A and B train: 2 layers × 3 targets × (A, B) = 12 tensors, and the optimiser holds nothing else
    assert len(learner.params) == 12 and all(".lora_" in n for n, p in learner.policy.named_parameters()
                                             if p.requires_grad)
    start = full_weights(learner)  # B = 0: the merged policy is the base model, bit for bit
    assert sorted(start) == sorted(base)
    for k, v in base.items():
        np.testing.assert_array_equal(start[k], v, err_msg=k)
    data = _data(tokenizer, 3)
    for s in range(3):
        m = learner.step(data[s], version=s)
    after = full_weights(learner)
    changed = [k for k in base if not np.array_equal(after[k], base[k])]
    # exactly the targeted weights moved (merged W + 2·B·A), every other weight is the frozen base
    assert sorted(changed) == sorted(f"model.layers.{i}.{m}.weight" for i in range(2)
                                     for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"))
    assert m["kl/ref"] != 0  # the adapters moved the policy away from its reference (0 at the start)
    # the reference (adapters off) scores exactly as a frozen copy of the base would
    frozen = learner.build_model(trainable=False)
    rows = rows_from_groups(data[0], learner.vocab_size)
    _, mbs = learner._layout(rows, list(range(len(rows))))
    for mb in mbs:
        with torch.no_grad():
            ref, _ = learner.reference()(**mb.inputs())
            expected, _ = frozen(**mb.inputs())
        torch.testing.assert_close(ref, expected, atol=1e-6, rtol=0)
    assert learner.policy.top_p == cfg.rollout.top_p  # the reference's untruncated distribution was temporary
    # an adapter push (model.lora.sync: adapter, the default) carries the 12 adapter tensors alone, in peft's names
    from learner.lora import adapter_weights

    pushed = dict(adapter_weights(learner.policy, torch.float32))
    assert len(pushed) == 12 and all(n.startswith("base_model.model.model.layers.") and
                                     n.endswith((".lora_A.weight", ".lora_B.weight")) for n in pushed), sorted(pushed)
    a = pushed["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert a.shape[0] == 4 and a.data_ptr() != dict(learner.policy.named_parameters())[
        "lm.base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"].data_ptr()  # a new tensor


def test_resume_from_an_adapter_checkpoint_is_exact(tiny_dir, tokenizer, tmp_path):
    cfg = _cfg()
    data = _data(tokenizer, 4)
    straight = Learner(cfg, 0, 1, tiny_dir)
    rows = [straight.step(d, version=s) for s, d in enumerate(data)]
    first = Learner(cfg, 0, 1, tiny_dir)
    first.step(data[0], version=0)
    first.step(data[1], version=1)
    saved = first.save(tmp_path / "ckpt")
    names = []
    for f in (saved / "policy").glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names += list(h.keys())  # noqa: SIM118 (not a dict)
    # adapter-only: model and AdamW state of the 12 adapter tensors, nothing of the frozen base
    assert names and all(".lora_" in n for n in names if not n.endswith(".step")), names
    assert json.loads((saved / "learner_state.json").read_text())["lora"]["rank"] == 4
    resumed = Learner(cfg, 0, 1, tiny_dir)
    resumed.load(saved)
    later = [resumed.step(d, version=s) for s, d in enumerate(data[2:], start=2)]
    for a, b in zip(rows[2:], later):
        assert a["loss/total"] == b["loss/total"] and a["optim/grad_norm"] == b["optim/grad_norm"]
    w_straight, w_resumed = full_weights(straight), full_weights(resumed)
    for k, v in w_straight.items():
        np.testing.assert_array_equal(w_resumed[k], v, err_msg=k)
    full = Learner(make_cfg("grpo", learner={"batch_prompts": 2}), 0, 1, tiny_dir)
    with pytest.raises(ValueError, match="model.lora"):  # a full-parameter run cannot take it, nor the reverse
        full.load(saved)


def test_export_is_a_peft_adapter_and_a_merged_model(tiny_dir, tokenizer, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = Learner(_cfg(export_merged=True, sync="merged"), 0, 1, tiny_dir)
    for s, d in enumerate(_data(tokenizer, 2)):
        learner.step(d, version=s)
    out = export_hf(learner.save(tmp_path / "ckpt"), tmp_path / "hf")
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "merged"} <= {p.name for p in
                                                                                                  out.iterdir()}
    assert not (out / "config.json").exists()  # an adapter directory, not a model
    ids = torch.tensor([tokenizer.encode("12+7=")])
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, out).eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32)(ids).logits
    assert (adapted - plain).abs().max() > 1e-4  # the adapter is in the file and peft applies it
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)  # merged = base + scale·B·A
    expected = dict(full_weights(learner))
    loaded = load_file(str(out / "merged" / "model.safetensors"))
    for k, v in loaded.items():
        np.testing.assert_allclose(v.double().numpy(), expected[k], atol=1e-6, rtol=0, err_msg=k)


@pytest.mark.slow
def test_two_fsdp_ranks_train_the_adapters_as_one_and_resume_on_one(tiny_dir, tokenizer, tmp_path):
    cfg = _cfg()
    data = _data(tokenizer, 3)
    one = Learner(cfg, 0, 1, tiny_dir)
    after_one = [one.step(d, version=s) for s, d in enumerate(data[:2])]
    with LearnerGroup(cfg, 2, str(tiny_dir), timeout_s=300) as group:
        after_two = [group.step(d, version=s) for s, d in enumerate(data[:2])]
        w_two = group.call(full_weights)[0]
        saved = group.save(tmp_path / "two")
    for a, b in zip(after_one, after_two):  # the same global batch: the same loss and gradient
        assert b["loss/total"] == pytest.approx(a["loss/total"], rel=1e-5, abs=1e-7)
        assert b["optim/grad_norm"] == pytest.approx(a["optim/grad_norm"], rel=1e-4)
    for k, v in full_weights(one).items():
        np.testing.assert_allclose(w_two[k], v, atol=2e-6, rtol=0, err_msg=k)
    back = Learner(cfg, 0, 1, tiny_dir)
    back.load(saved)  # 2 ranks' adapter shards and AdamW moments gathered into one rank
    for k, v in full_weights(back).items():
        np.testing.assert_array_equal(v, w_two[k], err_msg=k)
    again_one, again_back = one.step(data[2], version=2), back.step(data[2], version=2)
    assert again_back["loss/total"] == pytest.approx(again_one["loss/total"], rel=1e-5, abs=1e-7)


def _probe(model_dir, prompt: str, adapter=None) -> dict:
    """vLLM (CPU, in a child process: tests/learner/vllm_load_probe.py) serving `prompt` from `model_dir`, through
    the peft `adapter` when given: its prompt log-probs."""
    args = [sys.executable, str(Path(__file__).with_name("vllm_load_probe.py")), str(model_dir), prompt]
    proc = subprocess.run(args + ([str(adapter)] if adapter else []), capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[0].removeprefix("PROBE_RESULT "))


@pytest.mark.slow
def test_vllm_serves_the_exported_adapter_as_peft_does(tiny_dir, tokenizer, tmp_path):
    """vLLM loads the base with LoRA on and serves the exported peft adapter with peft's log-probs. (The merged
    export equals peft's output: the test above; vLLM serving an HF export: test_checkpoint.py.)"""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = Learner(make_cfg("sft", model={"lora": LORA}, learner={"lr": 3e-2}),
                      0, 1, tiny_dir)  # a big step, so the adapter moves the log-probs visibly
    for s in range(2):
        learner.step(make_groups(tokenizer, 2, 4, seed=s), s)
    out = export_hf(learner.save(tmp_path / "ckpt"), tmp_path / "hf")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], tokenize=False,
                                           add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids])
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        plain = torch.log_softmax(base(x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]
        peft_model = PeftModel.from_pretrained(base, out).eval()
        adapted = torch.log_softmax(peft_model(x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]
    assert (adapted - plain).abs().max() > 1e-2
    served = _probe(tiny_dir, prompt, adapter=out)
    assert served["prompt_token_ids"] == ids
    torch.testing.assert_close(torch.tensor(served["prompt_logprobs"][1:]), adapted, atol=1e-3, rtol=1e-3)
