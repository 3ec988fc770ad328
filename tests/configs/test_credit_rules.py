"""The batch against the buffer's credit (`RunConfig._credit_problems`): a batch the buffer cannot hold is
refused at parse time naming the fix; the shipped configs, the e2e tests' settings and the legal
"actors take turns" layouts are accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import ConfigError, resolve

ROOT = Path(__file__).resolve().parents[2]


def test_a_batch_larger_than_the_buffer_is_refused_naming_the_fix():
    with pytest.raises(ConfigError) as e:
        resolve("grpo", overrides=["learner.batch_prompts=40", "buffer.capacity_groups=32"])
    # grpo.yaml: K = 1, so the whole staleness window is (1 + 1) × 40 = 80 groups
    assert ("learner.batch_prompts: a batch of 40 groups cannot be pulled from a buffer that holds at most "
            "buffer.capacity_groups=32 (stored + in flight) — raise buffer.capacity_groups to at least 40 "
            "(80 = (max_staleness + 1) × batch_prompts lets the actors use the whole staleness window) or lower "
            "learner.batch_prompts") in str(e.value)


def test_the_boundary_and_the_layouts_that_take_turns_are_accepted():
    cfg = resolve("grpo", overrides=["learner.batch_prompts=32", "buffer.capacity_groups=32"])
    assert cfg.learner.batch_prompts == cfg.buffer.capacity_groups == 32  # one batch exactly fits
    # more actors than credit units ((1 + 1) × 8 = 16 < 32), as tests/launch/test_cluster_plan.py plans
    cfg = resolve("pure", flags={"rollout.num_actors": 32}, overrides=["learner.batch_prompts=8"])
    assert cfg.rollout.num_actors == 32
    # SFT builds its batches from the demonstrations, not from the buffer
    assert resolve("sft", overrides=["learner.batch_prompts=300"]).learner.batch_prompts == 300


@pytest.mark.parametrize("algo", ["grpo", "luffy", "pacs", "prime", "pure", "rloo", "sft"])
def test_the_shipped_configs_pass(algo):
    resolve(algo)


def test_the_quickstart_and_the_e2e_settings_pass():
    from tests.e2e.helpers import SMALL

    resolve(config_file=str(ROOT / "configs" / "quickstart.yaml"))
    sets = [SMALL[i + 1] for i in range(0, len(SMALL), 2) if SMALL[i] == "--set"]
    for algo in ("grpo", "luffy", "pacs", "prime", "pure", "rloo", "sft"):
        resolve(algo, overrides=sets)
