"""Multi-turn rollouts on a real vLLM engine with the tiny model: two turns per trajectory, each a new request
on the token ids so far, the observation's tokens appended once and masked, every policy token with its log mu
and the weight version of its own turn (a version change between the turns shows on turn 2 only)."""

from __future__ import annotations

import numpy as np

from buffer.records import ENV_VERSION
from tests.actors.conftest import run_config
from tests.actors.helpers import on_actor_loop


def test_two_turns_on_the_engine(host, model_dir, prompts, tokenizer):
    from actors.actor import RolloutActor
    from tests.actors import turn_env

    # turns of at most 8 tokens: the untrained model rarely says eos, and a cut turn goes on (its end of turn
    # appended with the observation); 24 response tokens in all
    cfg = run_config(rollout__n=turn_env.GROUP, env__environment="tests.actors.turn_env:TwoTurns", env__max_turns=3,
                     env__max_turn_tokens=8)
    actor = RolloutActor(cfg, 0, model_dir, "tcp://127.0.0.1:1", prompts, host=host)
    try:
        actor.start()
        turn_env.ENGINE = actor.core.engine
        start = on_actor_loop(actor, lambda core: _version(core))
        group = on_actor_loop(actor, lambda core: core.make_group(prompts[0]))
        stats = actor.core.stats()
    finally:
        actor.close()
    obs = tokenizer("<|user|>12*34=408<|assistant|>", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    assert list(group.prompt_tokens) == list(prompts[0].prompt_ids)
    for s in group.samples:
        env = np.flatnonzero(s.env_mask)
        first, second = np.arange(env[0]), np.arange(env[-1] + 1, len(s.tokens))
        closed = s.tokens[first[-1]] == eos  # turn 1 ended with eos; else it was cut at 8 and </s> closes it
        assert s.tokens[env].tolist() == ([] if closed else [eos]) + obs  # tokenized once, appended as is
        assert closed or first.size == 8
        assert (s.versions[first] == start).all() and (s.versions[second] == turn_env.NEXT_VERSION).all()
        assert (s.versions[env] == ENV_VERSION).all() and (s.logprobs[env] == 0).all()
        assert (s.logprobs[s.policy_mask] <= 0).all() and np.isfinite(s.logprobs).all()
        # 0.25 + 0.5 over two steps; a turn 2 that ran out of the 24 tokens (4 left) ends the episode unstepped
        assert (s.finish_reason, s.reward) in (("stop", 0.75), ("length", 0.25))
        assert s.truncated == (s.finish_reason == "length")
    assert stats["env_trajectories"] == 2 and stats["env_turns"] == 4 and stats["env_errors"] == 0


async def _version(core):
    return int(await core.engine.get_weight_version())


def test_environment_faults_end_their_trajectories_and_the_group_is_delivered_once(host, model_dir, prompts):
    """One group of 4 on the real engine: trajectories whose environment raises, hangs or floods end with their
    counted reason; the group is still made once, with all 4 rows, and the actor goes on (a second group)."""
    from actors.actor import RolloutActor

    cfg = run_config(env__environment="tests.actors.turn_env:Faults", env__max_turn_tokens=6, env__call_timeout_s=0.5)
    actor = RolloutActor(cfg, 0, model_dir, "tcp://127.0.0.1:1", prompts, host=host)
    try:
        actor.start()
        group = on_actor_loop(actor, lambda core: core.make_group(prompts[1]))
        again = on_actor_loop(actor, lambda core: core.make_group(prompts[2]))
        stats = actor.core.stats()
    finally:
        actor.close()
    assert sorted(s.finish_reason for s in group.samples) == ["env_error", "env_timeout", "env_truncated", "stop"]
    assert group.n == again.n == 4 and group.group_id != again.group_id
    assert [s.reward for s in group.samples if s.finish_reason == "stop"] == [1.0]
    for s in group.samples:
        assert not s.env_mask.any() and len(s.tokens) <= 6  # one turn each (cut at 6), nothing of the fault appended
    assert (stats["env_errors"], stats["env_timeouts"], stats["env_truncated"]) == (2, 2, 2)  # two groups
    assert stats["env_trajectories"] == 8
