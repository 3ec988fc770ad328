"""`data.arithmetic.level` and the step-by-step testbed's YAML (configs/testbeds/steps.yaml)."""

from __future__ import annotations

import pytest
import yaml

import algos
from configs.loading import ConfigError, dump, resolve
from configs.schema import RunConfig
from launch.prep.testbed import yaml_of_testbed


@pytest.mark.parametrize("level, digits", [("steps-main", (4, 5)), ("steps-hard", (7, 8))])
def test_a_level_sets_the_digits_and_ops_and_round_trips(level, digits):
    cfg = resolve("grpo", overrides=[f"data.arithmetic.level={level}"])
    a = cfg.data.arithmetic
    assert (a.min_digits, a.max_digits, a.ops, a.level) == (*digits, ["+", "-"], level)
    assert RunConfig.model_validate(yaml.safe_load(dump(cfg))) == cfg  # config.yaml holds level and its digits


def test_a_key_repeating_the_levels_value_is_accepted_and_one_contradicting_it_refused():
    same = resolve("grpo", overrides=["data.arithmetic.level=steps-hard", "data.arithmetic.max_digits=8",
                                      "data.arithmetic.ops=[-, +]"]).data.arithmetic
    assert (same.max_digits, same.ops) == (8, ["+", "-"])
    with pytest.raises(ConfigError, match="data.arithmetic: level steps-hard sets max_digits to 8, and max_digits is "
                                          "given as 3 — drop data.arithmetic.max_digits or data.arithmetic.level"):
        resolve("grpo", overrides=["data.arithmetic.level=steps-hard", "data.arithmetic.max_digits=3"])
    with pytest.raises(ConfigError, match="data.arithmetic.level: Input should be 'steps-main' or 'steps-hard'"):
        resolve("grpo", overrides=["data.arithmetic.level=medium"])


def test_no_level_leaves_the_quickstart_task_as_it_was():
    a = resolve("grpo").data.arithmetic
    assert (a.min_digits, a.max_digits, a.ops, a.level) == (1, 2, ["+", "-"], None)


@pytest.mark.parametrize("algo", algos.names())
def test_the_yaml_of_testbed_lays_over_every_algorithm(algo):
    cfg = resolve(algo, str(yaml_of_testbed("steps")))
    assert cfg.algo == algo and cfg.data.arithmetic.level == "steps-main"
    assert (cfg.model.tiny.num_layers, cfg.model.tiny.hidden_size) == (4, 128)
    # prompt (at most 256) + response (256) fit the warm model's context of 512 (a rule refuses more)
    assert cfg.rollout.max_response_tokens == 256 and cfg.model.tiny.max_position_embeddings == 512

