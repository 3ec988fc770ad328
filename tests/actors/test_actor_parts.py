"""Fast tests of the actor's pure parts (no engine): version stamping from vLLM's spans, log mu
extraction, LUFFY row planning and prefixes, prompt sharding/cursor, engine arguments."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from actors.engine import EngineSpec, set_kv_cache_env
from actors.link import Backoff
from actors.luffy import guided_request, plan_group, strip_eos
from actors.prompts import PromptCursor, PromptItem, shard
from actors.rows import RowError, prefix_only_sample, sampled_logprobs, versions_from_spans, with_prefix
from algos.luffy.options import LuffyOptions as LuffyConfig
from buffer.records import Sample
from configs.schema import RunConfig


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


def test_cursor_order_is_a_function_of_seed_actor_and_epoch():
    """What lets a successor resume from the ledger alone: two cursors of the same shard hand out the
    same sequence, epoch after epoch, and each epoch is a fresh permutation of the shard."""
    c, d = PromptCursor(items(5), seed=1, actor_id=0), PromptCursor(items(5), seed=1, actor_id=0)
    seq = [c.next_keyed() for _ in range(15)]
    assert [(e, it.prompt_index) for it, e in seq] == [(e, it.prompt_index) for it, e in (d.next_keyed()
                                                                                         for _ in range(15))]
    epochs = [[it.prompt_index for it, e in seq if e == k] for k in range(3)]
    assert all(sorted(ep) == list(range(5)) for ep in epochs) and len({tuple(ep) for ep in epochs}) > 1
    with pytest.raises(ValueError, match="empty"):
        PromptCursor([], actor_id=3)


def test_a_successor_walking_the_shard_past_the_ledger_loses_and_repeats_nothing():
    """A crashed actor handed out all of epoch 0 and 4 prompts of epoch 1. The ledger accounts for
    (trained, discarded or held) all but two of epoch 0 (in flight at the crash) and two of the four of
    epoch 1 (one undelivered in its outbox, one running). Its successor, walking the shard from the top
    with that set skipped, first generates exactly the four lost prompts, in shard order, then the rest
    of epoch 1 -- each prompt of each epoch once."""
    def key(pair):
        item, epoch = pair
        return epoch, item.prompt_index

    dead = PromptCursor(items(10), seed=3, actor_id=1)
    handed = [key(dead.next_keyed()) for _ in range(14)]
    lost = [handed[3], handed[8], handed[11], handed[13]]
    settled = set(handed) - set(lost)

    succ = PromptCursor(items(10), seed=3, actor_id=1)
    succ.skip(settled)
    got = [key(succ.next_keyed()) for _ in range(10)]
    assert got[:4] == lost  # the lost prompts first, in the order the shard hands them out
    assert got[4:] == [key(dead.next_keyed()) for _ in range(6)]  # then epoch 1 goes on where the dead one was
    assert sorted(settled | set(got)) == [(e, i) for e in (0, 1) for i in sorted(it.prompt_index
                                                                                for it in items(10))]
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
    assert "enable_prefix_caching" not in kw  # vLLM's default (on): every push clears the cache
    # pushes that keep the KV cache (clear_cache false) keep vLLM's default too: requests are salted by version
    kept = RunConfig(weight_sync={"clear_cache": False})
    assert "enable_prefix_caching" not in EngineSpec.from_config(kept, tmp_path, weight_transfer=False).engine_args_kwargs()
    on = RunConfig(weight_sync={"clear_cache": False}, rollout={"engine": {"enable_prefix_caching": True}})
    assert EngineSpec.from_config(on, tmp_path, weight_transfer=False).engine_args_kwargs()["enable_prefix_caching"]
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert set_kv_cache_env(0.5) == 1
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert set_kv_cache_env(0.5) == 3


def test_backoff_doubles_to_cap():
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1


@pytest.mark.parametrize("seeded", [False, True])
def test_rollout_requests_are_seeded_only_when_asked(seeded):
    """C5: vLLM samples every seeded sequence with its own generator, in a Python loop over the sequences
    at every decode step (vllm/v1/sample/ops/topk_topp_sampler.py, CPU and GPU paths); rollout requests
    are unseeded unless `rollout.seeded` asks for it."""
    import asyncio

    from actors.generate import GroupSampler, SamplingSettings
    from actors.luffy import GroupPlan

    seen = []

    class Engine:
        async def generate(self, prompt, params, request_id):
            seen.append(params)
            raise LookupError("stop after the request")
            yield

    class Tokenizer:
        eos_token_id = 0

    settings = SamplingSettings.from_config(RunConfig(rollout={"seeded": seeded}).rollout)
    assert settings.seeded is seeded
    sampler = GroupSampler(Engine(), Tokenizer(), settings, reward_fn=lambda *a: 0.0)
    with pytest.raises(LookupError):
        asyncio.run(sampler.sample_group(PromptItem(0, (5, 6), "1"), GroupPlan(on_policy=8, demo_rows=0)))
    sampler.close()
    assert seen[0].n == 8 and (seen[0].seed is not None) is seeded


class SaltEngine:
    """An `AsyncLLM` stand-in: records each request's prompt and answers with one finished output of two tokens
    per sample; `push_at` = the number of requests after which a push lands (the version goes up by one)."""

    def __init__(self, version, push_at=None):
        self.version, self.push_at, self.prompts = version, push_at, []

    async def get_weight_version(self):
        return str(self.version())

    async def generate(self, prompt, params, request_id):
        from types import SimpleNamespace

        self.prompts.append(prompt)
        if len(self.prompts) == self.push_at:
            self.version(+1)
        await asyncio.sleep(0)  # the group's other requests start meanwhile
        v = str(self.version())
        comps = [SimpleNamespace(index=i, token_ids=[7, 0], logprobs=[{7: Lp(-0.5)}, {0: Lp(-0.1)}],
                                 finish_reason="stop", weight_versions=[Span(v, 0, 2)]) for i in range(params.n)]
        yield SimpleNamespace(finished=True, outputs=comps)


class Lp:
    def __init__(self, logprob):
        self.logprob = logprob


class Tok:
    eos_token_id = 0

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["x"] * len(ids)


class Versions:
    """The actor's weight version as the receiver moves it: `v()` reads it, `v(+1)` is a push."""

    def __init__(self, v):
        self.v = v

    def __call__(self, step=0):
        self.v += step
        return self.v



def test_a_request_is_salted_with_the_version_its_group_starts_under():
    """`weight_sync.clear_cache` false keeps prefix caching on, so each request's prompt carries vLLM's
    `cache_salt` of the version its group started under (read once per group: a push landing while the group
    is in flight does not split it), and the next group the new one. Unsalted requests are the plain prompt."""
    from actors.generate import GroupSampler, SamplingSettings, request_prompt
    from actors.luffy import GroupPlan

    assert request_prompt((5, 6)) == {"prompt_token_ids": [5, 6]}
    assert request_prompt((5, 6), 0) == {"prompt_token_ids": [5, 6], "cache_salt": "weights-v0"}  # never empty
    version = Versions(3)
    engine = SaltEngine(version, push_at=1)  # the push lands during the group's first request
    sampler = GroupSampler(engine, Tok(), SamplingSettings(), reward_fn=lambda *a: 0.0, salt_version=version)
    item = PromptItem(0, (5, 6), "1", demo_ids=(8, 9, 10, 0))
    plan = GroupPlan(on_policy=2, demo_rows=0, guided=[0.5], ratios=[0.0, 0.0, 0.5])
    samples, _ = asyncio.run(sampler.sample_group(item, plan))
    assert [s.versions.tolist() for s in samples] == [[4, 4]] * 2 + [[-1, -1, 4, 4]]  # (prefix 2 of 4 demo tokens)
    asyncio.run(sampler.sample_group(item, GroupPlan(on_policy=2, demo_rows=0)))
    assert asyncio.run(sampler.evaluate([item]))["per_prompt"] == [[0, 0.0]]  # [prompt_index, reward]
    assert [p["cache_salt"] for p in engine.prompts] == ["weights-v3", "weights-v3", "weights-v4", "weights-v4"]
    assert engine.prompts[1]["prompt_token_ids"] == [5, 6, 8, 9]  # the guided row: prompt + demo prefix
    sampler.close()
    plain = SaltEngine(version)
    asyncio.run(GroupSampler(plain, Tok(), SamplingSettings(), reward_fn=lambda *a: 0.0).sample_group(
        item, GroupPlan(on_policy=2, demo_rows=0)))
    assert plain.prompts == [{"prompt_token_ids": [5, 6]}]


@pytest.mark.parametrize("clear_cache", [True, False, "auto"])  # auto: a CPU engine here, so true
def test_an_actor_salts_only_when_pushes_keep_the_cache(clear_cache, monkeypatch, tmp_path):
    """The actor's wiring: salted by its own version (the one credit is asked at) when `weight_sync.clear_cache`
    is false; a later group after a push (the receiver moves `version`) by the new one."""
    from actors import core

    monkeypatch.setattr(core, "load_tokenizer", lambda *a: Tok())
    cfg = RunConfig(weight_sync={"clear_cache": clear_cache})
    engine = SaltEngine(lambda: 5)
    item = PromptItem(0, (5, 6), "1")

    async def two_groups():
        actor = core.AsyncActor(cfg, 0, str(tmp_path), "tcp://127.0.0.1:9", [item], reward_fn=lambda *a: 0.0)
        await actor.start(engine)  # adopts the shared engine's label, 5
        await actor.make_group(item)
        actor.version = 6  # what the receiver's `_loaded` does after a push
        await actor.make_group(item)
        actor._push_task.cancel()
        actor.sampler.close()
        actor.link.close()
        actor.credit_link.close()

    asyncio.run(two_groups())
    want = [{"prompt_token_ids": [5, 6]}] * 2 if clear_cache else [
        {"prompt_token_ids": [5, 6], "cache_salt": f"weights-v{v}"} for v in (5, 6)]
    assert engine.prompts == want
