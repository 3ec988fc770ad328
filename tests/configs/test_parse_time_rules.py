"""Impossible configurations refused at parse time with the fix named; partial `--config` files layered
on the algorithm's YAML; `--dry-run`'s annotations."""

from __future__ import annotations

import pytest

from configs.loading import ConfigError, builtin_config_path, dump_annotated, read_yaml, resolve
from configs.schema import RunConfig


@pytest.mark.parametrize("algo,overrides,message", [
    ("grpo", ["rollout.n=1"], "rollout.n: grpo compares each sample with the other samples of its prompt's group, "
                              "which a group of 1 does not have — set rollout.n to at least 2"),
    ("rloo", ["rollout.n=1"], "rollout.n: rloo compares each sample"),
    ("pure", ["rollout.n=1"], "rollout.n: pure compares each sample"),
    ("grpo", ["data.arithmetic.min_digits=3", "data.arithmetic.max_digits=2"],
     "data.arithmetic.min_digits: 3 is more than data.arithmetic.max_digits=2 — swap them"),
    # 5 learner steps × 2 mini-batches × 1 epoch = 10 optimiser steps; a warm-up of 10 is allowed, 11 is not
    ("grpo", ["learner.steps=5", "learner.mini_batches=2", "learner.warmup_steps=11"],
     "learner.warmup_steps: 11 optimiser steps of LR warm-up exceed the whole run, learner.steps=5 × "
     "mini_batches 2 × epochs 1 = 10"),
    ("grpo", ["learner.steps=true"], "learner.steps: expects a number, got the boolean true"),
    ("grpo", ["rollout.n=false"], "rollout.n: expects a number, got the boolean false"),
    ("pacs", ["pacs.method=true"], "pacs.method: expects a number, got the boolean true"),
    ("grpo", ["learner.lr_horizon_steps=100"],  # grpo.yaml: cosine over 350 steps
     "learner.lr_horizon_steps: the cosine LR schedule reaches lr 0 at step 100, so steps 101–350 of "
     "learner.steps=350 would train at lr 0 — set learner.lr_horizon_steps=350"),
    ("grpo", ["rollout.max_response_tokens=300"],  # 256 + 300 = 556 > the tiny model's 512
     "rollout.max_response_tokens: data.max_prompt_tokens + rollout.max_response_tokens = 556 tokens exceed the "
     "built-in model's context, model.tiny.max_position_embeddings=512"),
])
def test_impossible_configs_are_refused_naming_the_fix(algo, overrides, message):
    with pytest.raises(ConfigError) as e:
        resolve(algo, overrides=overrides)
    assert message in str(e.value)


def test_the_boundaries_of_those_rules_are_accepted():
    assert resolve("grpo", overrides=["rollout.n=2"]).rollout.n == 2
    assert resolve("sft", overrides=["rollout.n=1"]).rollout.n == 1  # SFT samples nothing
    a = resolve("grpo", overrides=["data.arithmetic.min_digits=2", "data.arithmetic.max_digits=2"]).data.arithmetic
    assert (a.min_digits, a.max_digits) == (2, 2)
    # warm-up equal to the run's 5 × 2 = 10 optimiser steps reaches the peak at the last one
    assert resolve("grpo", overrides=["learner.steps=5", "learner.mini_batches=2"]).learner.warmup_steps == 10
    lc = resolve("grpo", overrides=["learner.lr_schedule=constant", "learner.lr_horizon_steps=10"]).learner
    assert lc.lr_horizon_steps == 10  # a constant schedule has no end to reach
    assert resolve("grpo", overrides=["model.path=/m", "rollout.max_response_tokens=4096"]).model.path == "/m"
    # booleans stay booleans, and PURE's legacy boolean `whiten` still converts
    assert resolve("grpo", overrides=["grpo.use_std=false"]).grpo.use_std is False
    assert resolve("pure", overrides=["pure.whiten=true"]).pure.whiten == "batch"
    # prefix caching with pushes that keep the KV cache is accepted: requests are salted by weight version
    # (actors.generate.request_prompt), so no request reuses a prefix cached under older weights
    for cache, prefix in [("false", "null"), ("false", "false"), ("true", "true"), ("false", "true")]:
        resolve("grpo", overrides=[f"weight_sync.clear_cache={cache}", f"rollout.engine.enable_prefix_caching={prefix}"])


def test_a_partial_config_is_laid_over_its_algorithms_yaml(tmp_path):
    partial = tmp_path / "mine.yaml"
    partial.write_text("algo: rloo\nlearner:\n  batch_prompts: 4\n")
    cfg = resolve(config_file=str(partial))
    tuned = read_yaml(builtin_config_path("rloo"))
    assert cfg.algo == "rloo" and cfg.learner.batch_prompts == 4
    # the rest is rloo.yaml's tuned values, not the schema defaults (lr 1e-5, 50 steps, 1 CPU per actor)
    assert cfg.learner.lr == tuned["learner"]["lr"] != RunConfig().learner.lr
    assert cfg.learner.steps == tuned["learner"]["steps"] == 350
    assert cfg.rollout.cpus_per_actor == tuned["rollout"]["cpus_per_actor"] == 0.5
    # --algo wins over the file's algo: prime.yaml comes in (its accuracy_window filter)
    with_prime = resolve("prime", config_file=str(partial))
    assert with_prime.algo == "prime" and with_prime.buffer.filter == "accuracy_window"
    assert with_prime.learner.batch_prompts == 4


def test_a_config_without_algo_names_the_key(tmp_path):
    partial = tmp_path / "mine.yaml"
    partial.write_text("learner:\n  lr: 3.0e-5\n")
    with pytest.raises(ConfigError, match=r"algo: .*mine.yaml has no `algo:` key, .* — add e.g. `algo: grpo`"):
        resolve(config_file=str(partial))
    assert resolve("pacs", config_file=str(partial)).learner.lr == 3e-5  # --algo names it instead
    partial.write_text("algo: nope\n")
    with pytest.raises(ConfigError, match="algo: unknown algorithm 'nope' in"):
        resolve(config_file=str(partial))


def test_dry_run_annotates_every_key_lists_choices_and_shows_one_algorithm():
    text = dump_annotated(resolve("pure"))
    lines = text.splitlines()
    assert all("  # " in line for line in lines), [line for line in lines if "  # " not in line]
    assert "  credit: minform  # " in text and "[choices: minform | uniform | strict | gamma]" in text
    assert "    ops: [+, '-']  # operators to draw from [choices: + | - | *]" in text
    assert "[choices: grpo | luffy | opd | pacs | prime | pure | rloo | sft]" in lines[0]
    top = {line.split(":")[0] for line in lines if not line.startswith(" ")}
    assert "pure" in top and not top & {"grpo", "prime", "luffy", "pacs"}
    assert "response limit per sample, tokens: generation is cut there" in text
    assert "a longer prompt is skipped (never cut)" in text
    # what --dry-run shows is what config.yaml holds, and it reads back to the same config
    path_cfg = resolve("pure")
    import yaml

    assert RunConfig.model_validate(yaml.safe_load(dump_annotated(path_cfg))) == path_cfg
