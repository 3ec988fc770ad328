"""`env:` is refused before start with the reason: a class or tool that does not fit, an algorithm that does
not train on multi-turn rows, limits that contradict the rest of the config. Off by default."""

from __future__ import annotations

import pytest

from configs.schema import RunConfig
from envs.environment import Environment, check_environment_class
from envs.tools import ToolLoadError


class NeedsArgs(Environment):
    def __init__(self, size):
        self.size = size


class TwoArgStep(Environment):
    def step(self, action, extra):
        return "", 0.0, True


class Fine(Environment):
    async def step(self, action):
        return "", 1.0, True


@pytest.mark.parametrize("cls,why", [
    (NeedsArgs, "without arguments"), (TwoArgStep, r"step\(self, action, extra\) must take one argument"),
    (len, "not a class"),
])
def test_an_environment_class_that_does_not_fit_is_refused(cls, why):
    with pytest.raises(ToolLoadError, match=why):
        check_environment_class(cls, "x.py:C")


def test_a_class_that_fits_passes():
    check_environment_class(Fine, "x.py:Fine")


def test_off_by_default():
    assert not RunConfig().env.enabled


@pytest.mark.parametrize("algo,section,why", [
    ("luffy", {}, "teacher files with multi-turn traces"),
    ("grpo", {"environment": "x.py:C"}, "choose one way in"),
    ("grpo", {"max_trajectory_tokens": 10_000}, "exceeds rollout.max_response_tokens"),
])
def test_combinations_that_are_not_supported_are_refused(algo, section, why):
    with pytest.raises(ValueError, match=why):
        RunConfig(algo=algo, env={"tools": ["calculator"], **section}, data={"demos": "d.jsonl"})


def test_pure_takes_multi_turn_rows():
    # a policy turn is a PURE step (algos.pure.steps.turn_spans; tests/learner/test_env_tokens.py)
    assert RunConfig(algo="pure", env={"tools": ["calculator"]}).env.enabled


def test_prime_with_a_discount_is_refused():
    with pytest.raises(ValueError, match="prime.gamma"):
        RunConfig(algo="prime", env={"tools": ["calculator"]}, prime={"gamma": 0.9}, buffer={"filter": "accuracy_window"})
    RunConfig(algo="prime", env={"tools": ["calculator"]}, buffer={"filter": "accuracy_window"})


def test_preflight_refuses_a_tool_or_environment_that_cannot_load(tmp_path):
    from launch.prep.preflight import PreflightError, check_env

    bad = tmp_path / "tools.py"
    bad.write_text("def lookup(key):\n    return key\n")  # no types, no docstring
    with pytest.raises(PreflightError, match="tool lookup: .*Google-style docstring"):
        check_env(RunConfig(env={"tools": [f"{bad}:lookup"]}), None)
    env = tmp_path / "game.py"
    env.write_text("class Game:\n    def __init__(self, board):\n        pass\n    def reset(self, record):\n"
                   "        return None\n    def step(self, action):\n        return '', 0.0, True\n")
    with pytest.raises(PreflightError, match="cannot be made without arguments"):
        check_env(RunConfig(env={"environment": f"{env}:Game"}), None)
    with pytest.raises(PreflightError, match="has no attribute 'Nope'"):
        check_env(RunConfig(env={"environment": f"{env}:Nope"}), None)
