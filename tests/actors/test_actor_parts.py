"""Fast tests of the actor's pure parts (no engine): version stamping from vLLM's spans, log mu
extraction, LUFFY row planning and prefixes, prompt sharding/cursor, engine arguments."""

from __future__ import annotations

import random

import numpy as np
import pytest

from actors.engine import EngineSpec, set_kv_cache_env
from actors.link import Backoff
from actors.luffy import guided_request, plan_group, strip_eos
from actors.prompts import PromptCursor, PromptItem, shard
from actors.rows import RowError, prefix_only_sample, sampled_logprobs, versions_from_spans, with_prefix
from buffer.records import Sample
from configs.schema import LuffyConfig, RunConfig


class Span:  # the shape of vllm.outputs.WeightVersionSpan
    def __init__(self, version, start, end):
        self.version, self.start, self.end = version, start, end


def test_versions_from_spans_stamps_each_token():
    v = versions_from_spans([Span("3", 0, 4), Span("4", 4, 9)], 9)
    assert v.dtype == np.int32 and v.tolist() == [3] * 4 + [4] * 5
    assert versions_from_spans(None, 0).size == 0
    with pytest.raises(RowError, match="no weight-version spans"):
        versions_from_spans(None, 3)
    with pytest.raises(RowError, match="do not cover"):
        versions_from_spans([Span("1", 0, 2)], 3)
    with pytest.raises(RowError, match="not an integer"):
        versions_from_spans([Span("default", 0, 3)], 3)


def test_vllm_span_type_matches():
    from vllm.outputs import WeightVersionSpan

    assert versions_from_spans([WeightVersionSpan("7", 0, 2)], 2).tolist() == [7, 7]


class Completion:
    def __init__(self, token_ids, logprobs):
        self.token_ids, self.logprobs = token_ids, logprobs


def test_sampled_logprobs_flat_and_list():
    from vllm.logprobs import FlatLogprobs, Logprob

    flat = FlatLogprobs()
    for tok, lp in ((5, -0.5), (9, -1.25)):
        flat.append({tok: Logprob(logprob=lp, rank=1, decoded_token=None)})
    assert sampled_logprobs(Completion([5, 9], flat)).tolist() == [-0.5, -1.25]
    as_list = [{5: Logprob(-0.5, 1, None)}, {9: Logprob(-1.25, 1, None)}]
    assert sampled_logprobs(Completion([5, 9], as_list)).tolist() == [-0.5, -1.25]
    with pytest.raises(RowError, match="sampled 7"):
        sampled_logprobs(Completion([5, 7], flat))
    with pytest.raises(RowError, match="positions"):
        sampled_logprobs(Completion([5], flat))
    with pytest.raises(RowError, match="logprobs=0"):
        sampled_logprobs(Completion([5], None))


def test_prefix_rows_are_off_policy():
    s = Sample(tokens=np.array([7, 8], np.int32), logprobs=np.array([-1, -2], np.float32),
               versions=np.array([4, 5], np.int32), prefix_mask=np.zeros(2, bool), reward=1.0)
    row = with_prefix(s, [1, 2, 3])
    assert row.tokens.tolist() == [1, 2, 3, 7, 8] and row.prefix_mask.tolist() == [True] * 3 + [False] * 2
    assert row.versions.tolist() == [-1, -1, -1, 4, 5] and row.logprobs.tolist() == [0, 0, 0, -1, -2]
    cut = prefix_only_sample([1, 2, 3, 4], 3, 0.0)
    assert cut.tokens.tolist() == [1, 2, 3] and cut.truncated and cut.prefix_mask.all() and (cut.versions == -1).all()


def test_plan_group_kinds():
    cfg = LuffyConfig(n_prefix=3, prefix_strategy="fixed", min_prefix_ratio=0.5, max_prefix_ratio=1.0)
    plan = plan_group(cfg, 4, step=0, rng=random.Random(0))
    assert (plan.on_policy, plan.demo_rows, plan.guided) == (1, 1, [0.5, 0.75])
    luffy_default = plan_group(LuffyConfig(), 8, step=3, rng=random.Random(0))  # the LUFFY script
    assert (luffy_default.on_policy, luffy_default.demo_rows, luffy_default.guided) == (7, 1, [])


def test_guided_request_same_with_or_without_stored_eos():
    eos = 2
    target = [10, 11, 12, 13, 14, 15, 16]
    a = guided_request([1, 5], target, eos, 0.5)
    b = guided_request([1, 5], target + [eos], eos, 0.5)
    assert a == b == ([1, 5, 10, 11, 12, 13], [10, 11, 12, 13])  # floor(8 * 0.5) = 4 prefix tokens
    assert strip_eos([3, 2, 2], 2) == [3]
    with pytest.raises(ValueError):
        guided_request([1], target, eos, 1.0)


def items(n):
    return [PromptItem(i, (1, i), str(i)) for i in range(n)]


def test_shards_partition_the_dataset():
    data = items(10)
    parts = [shard(data, a, 3) for a in range(3)]
    assert sorted(p.prompt_index for part in parts for p in part) == list(range(10))
    with pytest.raises(ValueError):
        shard(data, 3, 3)


def test_cursor_epochs_and_resume():
    c = PromptCursor(items(5), seed=1, actor_id=0)
    first = [c.next().prompt_index for _ in range(5)]
    assert sorted(first) == list(range(5))
    for _ in range(2):
        c.next()
    state = c.state_dict()
    rest = [c.next().prompt_index for _ in range(6)]
    d = PromptCursor(items(5), seed=1, actor_id=0)
    d.load_state_dict(state)
    assert [d.next().prompt_index for _ in range(6)] == rest
    with pytest.raises(ValueError, match="empty"):
        PromptCursor([], actor_id=3)


def test_successor_cursor_loses_no_prompt_of_a_crashed_actor():
    """A restarted actor resumes its predecessor's last reported cursor, serves the prompts that were
    unfinished at that report first, then continues the shard's order (prompts handed out after the
    report come round again); prompts trained or buffered meanwhile are skipped."""
    def key(pair):
        item, epoch = pair
        return epoch, item.prompt_index

    dead = PromptCursor(items(10), seed=3, actor_id=1)
    before = [key(dead.next_keyed()) for _ in range(4)]
    report, unfinished = dead.state_dict(), before[2:]  # the last 2 were in flight at the report
    after = [key(dead.next_keyed()) for _ in range(3)]  # handed out after the report; then it dies
    done = {before[0], before[1], before[3], after[1]}  # trained or held by the buffer at the restart

    succ = PromptCursor(items(10), seed=3, actor_id=1)
    succ.skip(done)
    succ.load_state_dict(report)
    succ.requeue(unfinished)
    got = [key(succ.next_keyed()) for _ in range(3)]
    assert got == [before[2], after[0], after[2]]
    assert set(before + after) == done | set(got)  # every prompt handed out: done, or generated again
    nxt = key(succ.next_keyed())
    assert nxt not in set(before + after)
    with pytest.raises(ValueError, match="not in its shard"):
        succ.requeue([(0, 10_000)])


def test_engine_spec_from_config(monkeypatch, tmp_path):
    cfg = RunConfig()
    spec = EngineSpec.from_config(cfg, tmp_path, actor_id=2, weight_transfer=False)
    kw = spec.engine_args_kwargs()
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["max_model_len"] == cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens
    assert kw["seed"] == 2 and kw["enforce_eager"]
    from vllm.engine.arg_utils import AsyncEngineArgs

    AsyncEngineArgs(**kw)  # every key is a real engine argument of the installed vLLM
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert set_kv_cache_env(0.5) == 1
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert set_kv_cache_env(0.5) == 3


def test_backoff_doubles_to_cap():
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1
