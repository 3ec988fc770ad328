"""The pure parts of `teacher.scoring: engine` (no engine): the scoring request, which of vLLM's prompt log-probs
are a row's response tokens, the learner's reading of scored rows, and the refusals before start. The engine itself
against the learner-side teacher: tests/learner/test_teacher_engine.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.logprobs import Logprob

from actors.engine import scoring_params
from algos.spec import TEACHER
from buffer.records import Group, Sample
from configs.schema import RunConfig
from launch.processes.teacher_scores import response_logprobs, score_request
from learner.batching import rows_from_groups
from learner.providers import EngineTeacherLogprobs, ProviderContext


def vllm_answer(prompt: list[int], response: list[int], value) -> tuple[list, dict]:
    """vLLM's answer to `score_request(prompt, response)` (prompt_logprobs=0, logprob_token_ids=[last]): None for
    the first prompt token, then {its id: Logprob} for each of prompt + response[:-1], with logprob value(k) (and
    one more top entry that must not be read); for the generated position, the last response token's."""
    ids = prompt + response
    entries = [None] + [{ids[k]: Logprob(value(k), rank=2), 99: Logprob(-0.01, rank=1)} for k in range(1, len(ids) - 1)]
    return entries, {ids[-1]: Logprob(value(len(ids) - 1), rank=3), 98: Logprob(-0.02, rank=1)}


def test_the_request_is_the_row_but_its_last_token_which_is_scored_as_the_next():
    ids, last = score_request(np.array([5, 6, 7]), np.array([8, 9]))
    assert (ids, last) == ([5, 6, 7, 8], 9)  # prompt + response ids as they are, but the last: scored as the next
    params = scoring_params(last)
    assert (params.max_tokens, params.prompt_logprobs, params.logprob_token_ids, params.temperature) == (1, 0, [9], 1.0)
    assert params.top_k in (0, -1, None) and params.top_p == 1.0  # the untruncated log-softmax
    assert params.skip_reading_prefix_cache  # vLLM's own rule for prompt log-probs: every position is computed


def test_response_token_t_is_prompt_position_p_plus_t_and_the_last_is_the_generated_position():
    # prompt of 3, response of 4: response token t is position 3 + t; here position k's log-prob is −k/10, so the
    # response's are −0.3, −0.4, −0.5 (prompt entries 3..5) and −0.6 (the generated position's named token)
    prompt, response = [5, 6, 7], [10, 11, 12, 13]
    got = response_logprobs(*vllm_answer(prompt, response, lambda k: -k / 10), prompt, response)
    np.testing.assert_array_equal(got, np.float32([-0.3, -0.4, -0.5, -0.6]))
    assert got.dtype == np.float32
    one = response_logprobs(*vllm_answer([5], [10], lambda k: -k / 10), [5], [10])  # a row of one and one token
    np.testing.assert_array_equal(one, np.float32([-0.1]))


def test_a_short_or_missing_answer_is_named():
    prompt, response = [5, 6], [7, 8]
    entries, last = vllm_answer(prompt, response, lambda k: -1.0)
    with pytest.raises(RuntimeError, match="returned 2 prompt log-probs for 3 tokens"):
        response_logprobs(entries[:2], last, prompt, response)
    entries[2] = {99: Logprob(-0.1)}
    with pytest.raises(RuntimeError, match="no log-prob for token 7 at position 2"):
        response_logprobs(entries, last, prompt, response)
    with pytest.raises(RuntimeError, match="no log-prob for token 8 at position 3"):
        response_logprobs(vllm_answer(prompt, response, lambda k: -1.0)[0], {98: Logprob(-0.1)}, prompt, response)


def ctx_of(rows) -> ProviderContext:
    width = max(len(r.response) for r in rows)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        mask[i, :len(r.response)] = torch.from_numpy(r.policy.astype(np.float32))
    return ProviderContext(rows=rows, local=list(range(len(rows))), microbatches=[], width=width,
                           old_logprobs=torch.zeros(len(rows), width), response_mask=mask,
                           rewards=torch.zeros(len(rows)), num_rows=len(rows), step=3)


def test_the_learner_reads_the_scores_masked_as_it_masks_its_own_teacher():
    # row 0: 4 tokens, the middle two an environment's (multi-turn) → their teacher term is 0; row 1: 2 tokens,
    # padded to the width 4 with 0
    env = np.array([False, True, True, False])
    samples = [Sample(tokens=np.array([1, 2, 3, 4]), logprobs=np.zeros(4, np.float32), versions=np.array([0, -1, -1, 0]),
                      prefix_mask=np.zeros(4, bool), reward=1.0, env_mask=env,
                      teacher_logprobs=np.float32([-0.5, -1.5, -2.5, -3.5])),
               Sample(tokens=np.array([7, 8]), logprobs=np.zeros(2, np.float32), versions=np.zeros(2, int),
                      prefix_mask=np.zeros(2, bool), reward=0.0, teacher_logprobs=np.float32([-0.25, -0.75]))]
    rows = rows_from_groups([Group("g", 0, np.array([9, 9]), samples)])
    got = EngineTeacherLogprobs()(ctx_of(rows))[TEACHER]
    torch.testing.assert_close(got, torch.tensor([[-0.5, 0.0, 0.0, -3.5], [-0.25, -0.75, 0.0, 0.0]]))
    samples[1].teacher_logprobs = None  # a row the driver did not score: named, never trained as a zero target
    with pytest.raises(RuntimeError, match="row 1 of step 3 has no teacher log-probs"):
        EngineTeacherLogprobs()(ctx_of(rows_from_groups([Group("g", 0, np.array([9, 9]), samples)])))
    samples[1].teacher_logprobs = np.float32([-1.0])
    with pytest.raises(ValueError, match="teacher_logprobs has 1 entries for 2 tokens"):
        rows_from_groups([Group("g", 0, np.array([9, 9]), samples)])


@pytest.mark.parametrize(("sections", "named"), [
    ({"algo": "opd"}, "teacher.scoring: engine needs a teacher to score with and teacher.path is unset"),
    ({"algo": "grpo", "teacher": {"path": "t"}}, "--algo grpo reads none — set teacher.scoring=learner, or use --algo opd"),
])
def test_engine_scoring_without_a_teacher_or_for_an_algorithm_that_reads_none_is_refused(sections, named):
    data = {**sections, "teacher": {**sections.get("teacher", {}), "scoring": "engine"}}
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(".", r"\.")):
        RunConfig.model_validate(data)
    ok = RunConfig.model_validate({"algo": "opd", "teacher": {"path": "t", "scoring": "engine"}})
    assert ok.teacher.scoring == "engine"
