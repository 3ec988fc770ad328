"""The turn loop, token in and token out, with a scripted policy and the tiny model's chat template: layout of
a trajectory (policy tokens as sampled, observations tokenized once, masks, versions per turn) and how the
environment's faults end it without touching the others."""

from __future__ import annotations

import asyncio
import functools
import threading

import numpy as np
import pytest

from buffer.records import ENV_VERSION
from envs.episode import ClassSteps, ToolSteps, run_episode
from envs.multiturn import MultiTurn, env_metrics
from envs.render import ObservationRenderer
from envs.tools import Toolbox
from tests.envs.helpers import EOS, TOKENIZER, ScriptedPolicy, decode, ids, limits, render_with


def mul(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return str(a * b)


CALL = '<tool_call>{"name": "mul", "arguments": {"a": 12, "b": 34}}</tool_call>'
RENDER = functools.partial(render_with, ObservationRenderer(TOKENIZER))


def run(policy, steps, **kw):
    return asyncio.run(run_episode(ids("<s>Q"), policy, steps, RENDER, decode, limits(**kw)))


def test_two_turns_keep_the_policy_tokens_and_append_the_tool_result_once():
    policy = ScriptedPolicy([CALL, "408"])
    box = Toolbox([mul], timeout_s=5)

    async def episode():
        turn1 = policy.__call__

        async def generate(prompt, max_tokens):  # a push lands between the turns: turn 2 is version 4
            out = await turn1(prompt, max_tokens)
            policy.version = 4
            return out

        return await run_episode(ids("<s>Q"), generate, ToolSteps(box), RENDER, decode, limits())

    t = asyncio.run(episode())
    turn1, turn2 = ids(CALL) + [EOS], ids("408") + [EOS]
    # the tiny template renders a tool result as <|user|><tool_response>..</tool_response>, then <|assistant|>
    obs = ids("<|user|><tool_response>408</tool_response><|assistant|>")
    s = t.sample(reward=1.0)
    assert s.tokens.tolist() == turn1 + obs + turn2
    assert s.env_mask.tolist() == [False] * len(turn1) + [True] * len(obs) + [False] * len(turn2)
    assert s.versions.tolist() == [3] * len(turn1) + [ENV_VERSION] * len(obs) + [4] * len(turn2)
    assert (s.logprobs[s.env_mask] == 0).all() and (s.logprobs[~s.env_mask] < 0).all()
    # each turn is a new request whose prompt is the token ids so far (never re-tokenized text)
    assert policy.prompts == [ids("<s>Q"), ids("<s>Q") + turn1 + obs]
    assert (t.ended, t.turns, t.tool_calls, s.finish_reason, s.truncated) == ("stop", 2, 1, "stop", False)
    box.close()


def test_limits_end_the_trajectory():
    box = Toolbox([mul], timeout_s=5)
    t = run(ScriptedPolicy([CALL]), ToolSteps(box), max_turns=3, max_tokens=1000)
    assert (t.ended, t.turns, t.tool_calls) == ("max_turns", 3, 3)  # no observation after the last turn
    assert not t.env[-1].any()
    t = run(ScriptedPolicy([CALL]), ToolSteps(box), max_tokens=len(ids(CALL)) - 5)  # the turn hits the budget
    assert t.ended == "length" and t.sample(0.0).truncated and len(t.tokens) == len(ids(CALL)) - 5
    # a tool result (48 tokens here) that would not leave room for another policy token ends it too
    t = run(ScriptedPolicy([CALL]), ToolSteps(box), max_tokens=len(ids(CALL)) + 30)
    assert t.ended == "env_truncated" and not t.sample(0.0).truncated and len(t.tokens) == len(ids(CALL)) + 1
    box.close()


class Faulty:
    """An environment whose step raises, hangs or answers a megabyte."""

    def __init__(self, fault: str):
        self.fault = fault

    def step(self, action):
        if self.fault == "raise":
            raise KeyError("broken")
        if self.fault == "hang":
            threading.Event().wait(3)
        if self.fault == "huge":
            return "x" * (1 << 20), 0.0, False
        return "go on", 0.5, False


@pytest.mark.parametrize("fault,ended", [("raise", "env_error"), ("hang", "env_timeout"), ("huge", "env_truncated")])
def test_an_environment_that_raises_hangs_or_floods_ends_its_trajectory(fault, ended):
    t = run(ScriptedPolicy(["a"]), ClassSteps(Faulty(fault), timeout_s=0.3), timeout_s=0.3)
    assert t.ended == ended and t.turns == 1 and t.fault
    s = t.sample(0.0)  # still a row: the policy's turn, nothing of the fault
    assert s.tokens.tolist() == ids("a") + [EOS] and not s.env_mask.any() and s.finish_reason == ended


def test_environment_rewards_add_up_over_turns():
    t = run(ScriptedPolicy(["a"]), ClassSteps(Faulty("none"), timeout_s=1), max_turns=3)
    assert (t.ended, t.turns, t.reward) == ("max_turns", 3, 1.5)  # 0.5 per step, 3 steps
    obs = ids("<|user|>go on<|assistant|>")
    assert t.tokens == (ids("a") + [EOS] + obs) * 2 + ids("a") + [EOS]


def test_a_waiting_tool_does_not_hold_the_other_trajectories():
    """Trajectory 0's tool blocks until trajectory 1 has finished: if one trajectory's tool held the loop
    (or the others), trajectory 1 could never finish and the group would time out."""
    others_done = threading.Event()

    def wait(x: int) -> str:
        """Wait for the others.

        Args:
            x: ignored
        """
        assert others_done.wait(10), "a waiting tool stalled the other trajectories"
        return "done"

    class Policy:
        def __init__(self):
            self.calls = 0

        async def __call__(self, prompt, max_tokens):
            self.calls += 1
            waiter = self.calls == 1  # the first trajectory to start calls the waiting tool
            text = '<tool_call>{"name": "wait", "arguments": {"x": 1}}</tool_call>' if waiter else "fine"
            return await ScriptedPolicy([text])(prompt, max_tokens)

    async def main():
        mt = MultiTurn(limits(), toolbox=Toolbox([wait], timeout_s=10), render=RENDER, decode=decode)

        async def score(lists):
            return [1.0] * len(lists)

        item = type("Item", (), {"prompt_ids": tuple(ids("<s>Q")), "prompt_index": 0})()
        policy = Policy()

        async def generate(prompt, max_tokens):
            out = await policy(prompt, max_tokens)
            if decode_text(out.tokens) == "fine":
                others_done.set()
            return out

        def decode_text(toks):
            return TOKENIZER.decode(toks, skip_special_tokens=True)

        samples, _ = await asyncio.wait_for(mt.group(item, 3, generate, score), 10)
        return mt, samples

    mt, samples = asyncio.run(main())
    assert sorted(int(s.env_mask.any()) for s in samples) == [0, 0, 1]
    m = env_metrics([mt.stats()])
    assert (m["env/trajectories"], m["env/tool_calls"], m["env/turns"], m["env/errors"]) == (3, 1, 4, 0)
    assert m["env/turns_mean"] == pytest.approx(4 / 3)
    mt.close()


def test_single_turn_runs_report_no_env_metrics():
    assert env_metrics([{"reward_errors": 0}]) == {}
    assert np.isfinite(limits().timeout_s)


def test_a_turn_cut_at_max_turn_tokens_goes_on_with_the_end_of_turn_as_environment_tokens():
    box = Toolbox([mul], timeout_s=5)
    lim = limits(max_turns=2)
    lim.max_turn_tokens = 5
    t = asyncio.run(run_episode(ids("<s>Q"), ScriptedPolicy(["abcdefgh"]), ClassSteps(Faulty("none"), 1), RENDER,
                                decode, lim))
    # turn 1: "abcde" (cut, no eos); then </s> closes it, as the template would, before the observation
    obs = ids("</s><|user|>go on<|assistant|>")
    assert t.tokens == ids("abcde") + obs + ids("abcde") and t.ended == "max_turns"
    assert t.sample(0.0).env_mask.tolist() == [False] * 5 + [True] * len(obs) + [False] * 5
    box.close()
