"""`model.lora` refused before start, naming the fix: bad keys at parse time (configs.lora_section), and against the
model's shape (`launch.prep.lora_check`, read from its config on the meta device) and vLLM's LoRA support."""

import json

import pytest
from pydantic import ValidationError

from configs.lora_section import LoraConfig
from configs.schema import RunConfig
from launch.prep.lora_check import lora_problem


def cfg(**lora) -> RunConfig:
    return RunConfig.model_validate({"model": {"lora": lora}})


def test_off_by_default_and_the_keys_mean_what_they_say():
    assert RunConfig().model.lora == LoraConfig() and not LoraConfig().enabled
    assert lora_problem(RunConfig(), None) is None  # off: nothing is checked
    c = LoraConfig(rank=8, alpha=16.0)
    assert c.enabled and c.scale == 2.0 and c.engine_max_rank() == 8  # 16 / 8
    assert LoraConfig(rank=8).scale == 1.0  # alpha null = rank
    assert LoraConfig(rank=9).engine_max_rank() == 16  # vLLM's max_lora_rank takes 1, 8, 16, 32, ...


@pytest.mark.parametrize(("lora", "words"), [
    ({"rank": 4, "dropout": 0.1}, "model.lora.dropout: 0.1 is not supported — set it to 0"),
    ({"rank": 4, "target_modules": ["q_proj", "q_proj"]}, "distinct module names"),
    ({"rank": 4, "target_modules": ["self_attn.q_proj"]}, "without dots"),
    ({"rank": 513}, "less than or equal to 512"),
    ({"rank": 4, "bias": "all"}, "Extra inputs are not permitted"),
])
def test_bad_keys_fail_at_parse_time(lora, words):
    with pytest.raises(ValidationError, match=words):
        cfg(**lora)


def test_the_tiny_model_takes_the_default_targets():
    assert lora_problem(cfg(rank=8), None) is None  # Llama: q/k/v/o and gate/up/down, vLLM serves LoRA on it


@pytest.mark.parametrize(("lora", "words"), [
    ({"rank": 4, "target_modules": ["q_proj", "qkv_proj"]},
     "model.lora.target_modules: 'qkv_proj' matches no layer of LlamaForCausalLM — choose among its linear layers: "
     "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    ({"rank": 4, "target_modules": ["lm_head"]}, "names lm_head, the output head"),
    ({"rank": 4, "target_modules": ["embed_tokens"]}, "a Embedding, not a linear layer"),
    # the tiny model's q_proj is 128 × 128 (hidden_size 128), its MLP 384 × 128
    ({"rank": 256, "target_modules": ["q_proj"]},
     "model.lora.rank: 256 exceeds the smaller dimension of model.layers.0.self_attn.q_proj (128 × 128) — use at "
     "most 128"),
])
def test_targets_and_rank_are_checked_against_the_model(lora, words):
    assert words in lora_problem(cfg(**lora), None)


def test_a_model_vllm_cannot_serve_with_lora_is_refused(tmp_path):
    # GPT-2 (vLLM's GPT2LMHeadModel has no LoRA support in 0.32); its linear layers are Conv1D, c_attn a target
    # name it has: the vLLM check is what refuses it
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 1, "n_head": 1,
        "vocab_size": 32, "n_positions": 64}))
    problem = lora_problem(cfg(rank=4, target_modules=["c_attn"]), tmp_path)
    assert "'c_attn' names transformer.h.0.attn.c_attn, a Conv1D, not a linear layer" in problem
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["MambaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 32}))
    problem = lora_problem(cfg(rank=4), tmp_path)
    assert problem.startswith("vLLM ") and "cannot serve LoRA adapters on MambaForCausalLM" in problem
    assert "model.lora.rank=0" in problem
