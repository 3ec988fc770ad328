"""LUFFY rows end to end: rho = 1 rows are attached by the buffer, 0 < rho < 1 rows are demonstration
prefix (off-policy: prefix_mask, version -1, log mu 0) + a generated on-policy continuation. The actor
takes each prompt's demonstration from its prompt items (`PromptItem.demo_ids`, as `launch.prep.data` loads
them), the buffer from `add_demos`."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tests.actors.conftest import run_config
from tests.actors.helpers import assert_same_group, hf_token_logprobs, load_hf, pull_all, record_sent

pytestmark = pytest.mark.slow


def luffy_run(make_actor, buffers, learner_client, prompts, demos, groups, **sets):
    cfg = run_config(algo="luffy", buffer__max_staleness=2, **sets)
    _, address = buffers.start(cfg)
    learner = learner_client(address)
    learner.add_demos(demos)
    actor = make_actor(cfg, address, prompts=[replace(p, demo_ids=tuple(demos[p.prompt_index].tolist()))
                                              for p in prompts])
    sent = record_sent(actor)
    assert actor.run(max_groups=groups) == groups
    pulled = pull_all(learner)
    assert sorted(g.group_id for g in pulled) == sorted(sent)
    for g in pulled:
        assert_same_group(sent[g.group_id][0], g)
    return cfg, actor, pulled


def test_prefix_rows_rho_one_and_fractional(make_actor, buffers, learner_client, prompts, demos, tokenizer, model_dir):
    # fixed strategy, 3 guided rows of 4: ratios 0.5, 0.75, 1.0 and one on-policy row
    T = 64  # room for a continuation after 3/4 of a demonstration (<= 55 tokens)
    cfg, actor, pulled = luffy_run(make_actor, buffers, learner_client, prompts, demos, 3, rollout__max_response_tokens=T,
                                   luffy__n_prefix=3,
                                   luffy__prefix_strategy="fixed", luffy__min_prefix_ratio=0.5,
                                   luffy__max_prefix_ratio=1.0)
    model = load_hf(model_dir)
    diffs = []
    for g in pulled:
        demo = demos[g.prompt_index].tolist()
        assert g.meta["demo_rows"] == 1 and g.meta["prefix_ratios"] == [0.0, 0.5, 0.75]
        assert g.n == 4  # 3 from the actor + the demonstration row the buffer attached
        on, half, three_q, full = g.samples
        assert not on.prefix_mask.any() and (on.versions == actor.version).all()
        # rho = 1: the whole demonstration with its eos, all off-policy
        assert full.tokens.tolist() == demo and full.prefix_mask.all() and (full.versions == -1).all()
        assert (full.logprobs == 0).all()
        for row, ratio in ((half, 0.5), (three_q, 0.75)):
            p = math.floor(len(demo) * ratio)
            assert p < T
            assert row.tokens[:p].tolist() == demo[:p]
            assert row.prefix_mask[:p].all() and not row.prefix_mask[p:].any()
            assert (row.versions[:p] == -1).all() and (row.versions[p:] == actor.version).all()
            assert (row.logprobs[:p] == 0).all() and (row.logprobs[p:] < 0).all()
            assert p < len(row.tokens) <= T
            assert row.truncated == (row.finish_reason == "length")
            # the continuation's log mu is conditioned on prompt + prefix
            ref = hf_token_logprobs(model, g.prompt_tokens.tolist() + demo[:p], row.tokens[p:].tolist())
            diffs.append(np.abs(ref - row.logprobs[p:]))
    d = np.concatenate(diffs)
    print(f"\ncontinuation log mu vs HF: mean |diff| {d.mean():.2e} over {d.size} tokens")
    assert d.mean() < 1e-4


def test_prefix_covering_the_answer_earns_the_reward(make_actor, buffers, learner_client, prompts, demos, tokenizer):
    """rho = 0.99 keeps the whole target (all but the eos) as prefix: the actor's own reward of that row
    is 1 (its text contains the teacher's boxed answer), through the real reward function."""
    from tasks.rewards import arithmetic  # the run's reward on the synthetic task (reward.fn unset)

    _, _, pulled = luffy_run(make_actor, buffers, learner_client, prompts, demos, 2, rollout__max_response_tokens=96,
                             luffy__n_prefix=1, luffy__prefix_strategy="fixed", luffy__min_prefix_ratio=0.99,
                             luffy__max_prefix_ratio=0.99)
    for g in pulled:
        assert g.meta["demo_rows"] == 0
        guided = [s for s in g.samples if s.prefix_mask.any()]
        assert len(guided) == 1
        text = tokenizer.decode(guided[0].tokens.tolist(), skip_special_tokens=True)
        assert guided[0].reward == arithmetic("", text, g.ground_truth, {}) == 1.0, text
