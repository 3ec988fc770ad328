"""Presets that fit the model (`configs.presets`): the built-in tiny model keeps its algorithm's YAML, a
user's model gets values for real models (each key the user set keeps the user's value), fitted to the
model's context, and `--dry-run` says which set applied and why."""

from __future__ import annotations

import json

import pytest

import algos
from configs.loading import builtin_config_path, read_yaml, resolve
from configs.presets import REAL_MODEL, describe, real_model_values
from launch.cli import main
from launch.planning.resources import Node, resolve_auto

# Qwen2.5-7B's config.json (the fields read), as tests/launch/test_doctor_checks.py has it
QWEN_7B = dict(num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
               vocab_size=152064, intermediate_size=18944, max_position_embeddings=4096, tie_word_embeddings=False)
TOKEN_KEYS = ("data.max_prompt_tokens", "rollout.max_response_tokens")


def model_dir(tmp_path, context: int = 4096, name: str = "q7b"):
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(QWEN_7B | {"max_position_embeddings": context}))
    return str(d)


def values(cfg, keys) -> dict:
    from configs.loading import value_of

    return {k: value_of(cfg, k) for k in keys}


@pytest.mark.parametrize("algo", algos.names())
def test_every_algorithm_resolves_both_ways(algo, tmp_path):
    yaml_lr = read_yaml(builtin_config_path(algo))["learner"]["lr"]
    tiny = resolve(algo)
    assert tiny.learner.lr == yaml_lr  # 1e-4 (SFT 1e-3): the tiny model's, as configs/<algo>.yaml states it
    assert (tiny.data.max_prompt_tokens, tiny.rollout.max_response_tokens) == (256, 128)
    real = resolve(algo, flags={"model.path": model_dir(tmp_path)})
    # before the presets a user's model ran with the tiny model's lr and 256/128-token limits
    assert values(real, real_model_values(algo)) == real_model_values(algo)
    assert real.learner.lr == {"prime": 5e-7, "sft": 1e-5}.get(algo, 1e-6)
    assert (real.data.max_prompt_tokens, real.rollout.max_response_tokens) == (1024, 3072)  # 4096: Qwen2.5-Math's context
    assert (real.learner.micro_batch_tokens, real.rollout.engine.max_num_seqs) == (16384, 1024)
    assert real.rollout.prompts_in_flight == "auto"
    if algo == "prime":  # the paper's 2:1 PRM:policy proportion at 7B, not the tiny model's 2e-4
        assert (tiny.prime.prm_lr, real.prime.prm_lr) == (2e-4, 1e-6)


def test_the_quickstart_keeps_its_values():
    quick = resolve(config_file=str(builtin_config_path("quickstart")))
    assert quick == resolve("grpo")
    assert describe(quick, set()).startswith("[presets] model.path is null: the built-in tiny model, so "
                                             "configs/grpo.yaml's values, tuned for it (learner.lr=0.0001, ")
    assert (quick.learner.lr, quick.data.max_prompt_tokens, quick.rollout.max_response_tokens) == (1e-4, 256, 128)
    assert (quick.learner.micro_batch_tokens, quick.rollout.engine.max_num_seqs) == ("auto", None)
    on_cpu = resolve_auto(quick, [Node("this machine", 2, 0, 24)])
    assert (on_cpu.rollout.prompts_in_flight, on_cpu.learner.micro_batch_tokens) == (16, None)


def test_what_the_user_sets_wins(tmp_path):
    path = model_dir(tmp_path)
    mine = tmp_path / "mine.yaml"
    mine.write_text("algo: pure\ndata:\n  max_prompt_tokens: 512\n")
    cfg = resolve(config_file=str(mine), flags={"model.path": path},
                  overrides=["learner.lr=3e-6", "rollout.prompts_in_flight=12", "actor_rollout_ref.rollout.max_num_seqs=64"])
    assert (cfg.learner.lr, cfg.data.max_prompt_tokens, cfg.rollout.prompts_in_flight) == (3e-6, 512, 12)
    assert cfg.rollout.engine.max_num_seqs == 64  # veRL's name, read as ours, is the user's too
    assert (cfg.rollout.max_response_tokens, cfg.learner.micro_batch_tokens) == (3072, 16384)  # not set: the set's
    # a --config file naming the model is the user's too, and what it spells out stays
    spelled = tmp_path / "spelled.yaml"
    spelled.write_text(f"algo: grpo\nmodel:\n  path: {path}\nlearner:\n  lr: 2.0e-5\n")
    assert (resolve(config_file=str(spelled)).learner.lr, resolve(config_file=str(spelled)).learner.micro_batch_tokens) \
        == (2e-5, 16384)


def test_the_limits_fit_the_models_context(tmp_path):
    # a 2048-token model: both limits from the set, so the prompt gets a quarter (512) and the response the rest
    small = resolve("grpo", flags={"model.path": model_dir(tmp_path, 2048, "small")})
    assert values(small, TOKEN_KEYS) == {"data.max_prompt_tokens": 512, "rollout.max_response_tokens": 1536}
    # a 512-token model and the user's 48-token responses: the prompt gets the 512 − 48 = 464 left
    tiny_ctx = resolve("pacs", flags={"model.path": model_dir(tmp_path, 512, "t")},
                       overrides=["rollout.max_response_tokens=48"])
    assert values(tiny_ctx, TOKEN_KEYS) == {"data.max_prompt_tokens": 464, "rollout.max_response_tokens": 48}
    # a 32k model keeps the set's 1024 + 3072; a model whose config.json cannot be read is not fitted
    assert values(resolve("grpo", flags={"model.path": model_dir(tmp_path, 32768, "big")}), TOKEN_KEYS) == \
        {"data.max_prompt_tokens": 1024, "rollout.max_response_tokens": 3072}
    assert resolve("grpo", flags={"model.path": str(tmp_path / "absent")}).rollout.max_response_tokens == 3072


def test_a_hub_id_is_fitted_from_the_local_hf_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from tests.hub_cache import hub_cache

    hub_cache(tmp_path / "hub", "org/small", __import__("pathlib").Path(model_dir(tmp_path, 2048, "src")))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # where no org/small folder exists: the value is a Hub id
    cfg = resolve("grpo", flags={"model.path": "org/small"})
    assert (cfg.learner.lr, *values(cfg, TOKEN_KEYS).values()) == (1e-6, 512, 1536)


def test_the_built_in_models_own_directories_keep_the_tiny_values(tmp_path):
    # the SFT warm-ups the run builds under model.cache_dir (bench/evidence/evidence.py passes one as model.path)
    warm = tmp_path / "cache" / "tiny-sft-300"
    warm.mkdir(parents=True)
    cfg = resolve("grpo", flags={"model.path": str(warm)}, overrides=[f"model.cache_dir={tmp_path / 'cache'}"])
    assert (cfg.learner.lr, cfg.rollout.max_response_tokens, cfg.rollout.prompts_in_flight) == (1e-4, 128, 16)
    assert describe(cfg, {"model.path", "model.cache_dir"}).startswith(
        f"[presets] model.path is {warm}, a directory under model.cache_dir: the built-in tiny model")


def test_dry_run_says_which_set_applied_and_why(tmp_path, capsys):
    path = model_dir(tmp_path, 2048)
    assert main(["--algo", "pure", "--model", path, "--set", "learner.lr=2e-6", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err == (f"[presets] model.path is a user model ({path}): real-model values for "
                   "learner.micro_batch_tokens=16384, rollout.engine.max_num_seqs=1024, "
                   "rollout.engine.max_num_batched_tokens=8192, rollout.prompts_in_flight=auto "
                   "(docs/running.md \"Presets that fit the model\"); fitted to its context of 2,048 tokens: data.max_prompt_tokens=512, "
                   "rollout.max_response_tokens=1536; yours: learner.lr=2e-06\n")
    assert "lr: 2.0e-06  # AdamW peak learning rate" in out and "prompts_in_flight: auto" in out
    assert main(["--algo", "grpo", "--dry-run"]) == 0
    assert capsys.readouterr().err == (
        "[presets] model.path is null: the built-in tiny model, so configs/grpo.yaml's values, tuned for it "
        "(learner.lr=0.0001, data.max_prompt_tokens=256, rollout.max_response_tokens=128, "
        "learner.micro_batch_tokens=auto, rollout.engine.max_num_seqs=null, "
        "rollout.engine.max_num_batched_tokens=null, rollout.prompts_in_flight=16)\n")


def test_the_real_model_set_names_only_keys_of_the_schema():
    from configs.loading import field_of

    for algo in algos.names():
        assert all(field_of(k) is not None for k in real_model_values(algo)), algo
    assert set(REAL_MODEL) <= set(real_model_values("prime"))
