"""End to end: a LoRA run (`model.lora`) of a user's model, `--serial` (learner and actor in the driver process,
a real vLLM engine, a real buffer process, real weight pushes): the adapters train on the frozen base, every
push carries the adapter alone (`model.lora.sync: adapter`, served by vLLM's LoRA; tests/actors/
test_actor_adapters.py proves the per-request pinning), the checkpoint holds the adapters only, and the run's output is a peft adapter
(plus the merged model) that peft and transformers load.

The model is `tests.e2e.real_model`'s random-init Qwen2 (q/k/v biases, grouped KV heads, tied embeddings) on
MATH-500: it scores 0, so the groups carry no advantage; a small entropy bonus moves the adapters.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.e2e.helpers import check_run, train, trained_rows
from tests.e2e.real_model import RealAssets

pytestmark = pytest.mark.slow


def test_a_lora_run_trains_adapters_pushes_only_them_and_exports_an_adapter(tmp_path, real_assets: RealAssets):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    args = ("--algo", "grpo", "--serial", "--actors", "1", "--max-staleness", "1", "--model", str(real_assets.model),
            "--data", str(real_assets.data), "--set", "loss.entropy_coef=0.01", "--set", "model.lora.rank=8",
            "--set", "model.lora.alpha=16", "--set", "model.lora.export_merged=true")
    train(out, None, "--steps", "3", *args)
    check_run(out, 3, 1, "loss/pg")
    base = load_file(str(real_assets.model / "model.safetensors"))
    full_bytes = sum(t.numel() * t.element_size() for t in base.values())

    names, adapter_bytes = [], 0
    for f in (out / "checkpoints" / "step_3" / "policy").glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names += list(h.keys())  # noqa: SIM118 (not a dict)
            adapter_bytes += sum(math.prod(h.get_slice(n).get_shape()) * 4 for n in h.keys() if n.startswith("model.") and ".lora_" in n)  # noqa: SIM118
    assert names and all(".lora_" in n for n in names if not n.endswith(".step")), names  # adapters only
    # every push is the adapter alone, in the serving dtype (fp32 on CPU): wire bytes = the adapter's + framing
    pushed = [r["weight_sync/bytes"] for r in trained_rows(out) if r.get("weight_sync/bytes")]
    assert pushed and all(adapter_bytes <= b < adapter_bytes * 1.05 for b in pushed), (pushed, adapter_bytes)
    print(f"\npush: {pushed[0]} B (adapter {adapter_bytes} B) against the model's {full_bytes} B")

    export = out / "hf" / "step_3"
    assert (export / "adapter_config.json").is_file() and (export / "adapter_model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(real_assets.model, dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        plain = model(ids).logits
        adapted = PeftModel.from_pretrained(model, export).eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(export / "merged", dtype=torch.float32)(ids).logits
    assert (adapted - plain).abs().max() > 0  # the adapters trained
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    changed = {k for k, v in load_file(str(export / "merged" / "model.safetensors")).items()
               if not torch.equal(v, base[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed), changed  # the adapted layers only

    # The same command with one more step resumes: the new engine starts from the base, labelled 3, and the
    # resume's first push brings it adapter 3 before any request (one run under K = 1 needs rows of version 3)
    proc = train(out, None, "--steps", "4", *args)
    assert "holds this command's run" in proc.stdout + proc.stderr
    check_run(out, 4, 1, "loss/pg")
    assert all(r["weight_sync/bytes"] == pushed[0] for r in trained_rows(out) if r.get("weight_sync/bytes"))
