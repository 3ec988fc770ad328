"""A group's n trajectories, run concurrently, scored and counted: what an actor calls instead of one request.

Each trajectory is its own asyncio task, so while one waits for a tool (or its environment's step) the
engine goes on with the others, of this group and of every other group in flight: a tool that sleeps L
seconds holds only its own trajectory.

Rewards (docs/running.md "Tools and environments"): with tools, the episode's reward is `reward.fn` given the
whole response decoded (policy turns and tool results, special tokens skipped), as veRL scores its agent
loop's responses; with an environment class it is the sum of its steps' rewards. Every row of the group then
takes the group baseline of its algorithm (GRPO, RLOO, PACS, PRIME) from that reward.

Counts (`counts`, summed into the run's env/* metrics, docs/metrics.md): trajectories, turns, tool calls,
bad calls (the model's unreadable or impossible calls, answered with an error), and the trajectories the
environment's side ended: errors, timeouts, truncated, plus max_turns.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from buffer.records import Sample
from envs.episode import ClassSteps, EnvFault, Limits, ToolSteps, Trajectory, call_with_timeout, run_episode
from envs.tools import Toolbox

Score = Callable[[list[list[int]]], Awaitable[list[float]]]


class MultiTurn:
    """The run's multi-turn rollouts on one actor: a `Toolbox` or an environment class, the limits, and how
    observations become token ids (`render`) and turns become text (`decode`), both awaited."""

    def __init__(self, limits: Limits, *, toolbox: Toolbox | None = None, env_class: type | None = None,
                 render, decode, prompt_of: Callable[[str], Awaitable[list[int]]] | None = None,
                 max_prompt_tokens: int | None = None):
        if (toolbox is None) == (env_class is None):
            raise ValueError("MultiTurn needs a toolbox or an environment class (one of them)")
        self.limits, self.toolbox, self.env_class = limits, toolbox, env_class
        self.render, self.decode, self.prompt_of = render, decode, prompt_of
        self.max_prompt_tokens = max_prompt_tokens
        self.counts: Counter = Counter()

    async def group(self, item, n: int, generate, score: Score, count: bool = True) -> list[Sample]:
        """The n rows of prompt `item` (`actors.prompts.PromptItem`). `generate(ids, max_tokens)` -> `Turn`;
        `score(token lists)` -> rewards (tools). `EnvFault` when the group cannot start (a reset failed or
        disagreed): nothing of it is delivered. `count=False` (held-out evaluation) leaves the env/* counts
        of the training rollouts as they are."""
        prompt = list(item.prompt_ids)
        if self.toolbox is not None:
            steps = [ToolSteps(self.toolbox) for _ in range(n)]
        else:
            steps, prompt = await self._reset(item, n, prompt)
        trajectories = await asyncio.gather(*(
            run_episode(prompt, generate, s, self.render, self.decode, self.limits) for s in steps))
        if self.toolbox is not None:
            rewards = await score([t.tokens for t in trajectories])
        else:
            rewards = [t.reward for t in trajectories]
        if count:
            self._count(trajectories)
        return [t.sample(r) for t, r in zip(trajectories, rewards)], prompt

    async def _reset(self, item, n: int, prompt: list[int]) -> tuple[list[ClassSteps], list[int]]:
        record = {"question": item.question, "ground_truth": item.ground_truth, "data_source": item.data_source,
                  "extra": dict(item.extra), "prompt_index": item.prompt_index}
        envs = [self.env_class() for _ in range(n)]
        try:
            first = await asyncio.gather(*(call_with_timeout(e.reset, record, timeout_s=self.limits.timeout_s)
                                           for e in envs))
        except EnvFault as e:
            self.counts[e.reason] += 1
            raise
        if any(f != first[0] for f in first):
            self.counts["errors"] += 1
            raise EnvFault("errors", f"prompt {item.prompt_index}: reset returned different first observations for "
                                     "one group, whose rows share their prompt — make reset a function of the record")
        if first[0]:
            if not isinstance(first[0], str) or self.prompt_of is None:
                self.counts["errors"] += 1
                raise EnvFault("errors", f"reset returned {first[0]!r:.80}, expected a str or None")
            prompt = await self.prompt_of(first[0])
            if self.max_prompt_tokens is not None and len(prompt) > self.max_prompt_tokens:
                self.counts["truncated"] += 1
                raise EnvFault("truncated", f"reset's first observation is {len(prompt)} prompt tokens, over "
                                            f"data.max_prompt_tokens={self.max_prompt_tokens}")
        return [ClassSteps(e, self.limits.timeout_s) for e in envs], prompt

    def _count(self, trajectories: list[Trajectory]) -> None:
        c = self.counts
        for t in trajectories:
            c["trajectories"] += 1
            c["turns"] += t.turns
            c["tool_calls"] += t.tool_calls
            c["bad_calls"] += t.bad_calls
            for reason, ended in (("errors", "env_error"), ("timeouts", "env_timeout"),
                                  ("truncated", "env_truncated"), ("max_turns", "max_turns")):
                c[reason] += t.ended == ended

    def stats(self) -> dict:
        """The counts as actor stats keys (`env_<name>`)."""
        return {f"env_{k}": v for k, v in self.counts.items()}

    def close(self) -> None:
        if self.toolbox is not None:
            self.toolbox.close()


ENV_METRICS = ("trajectories", "turns", "tool_calls", "bad_calls", "errors", "timeouts", "truncated", "max_turns")


def env_metrics(reports) -> dict:
    """env/* metrics: the actors' counts summed over the live actors since they started (docs/metrics.md); {}
    when no actor runs multi-turn rollouts."""
    reports = [r for r in reports if "env_trajectories" in r or "env_errors" in r]
    if not reports:
        return {}
    out = {f"env/{k}": sum(r.get(f"env_{k}", 0) for r in reports) for k in ENV_METRICS}
    out["env/turns_mean"] = out["env/turns"] / out["env/trajectories"] if out["env/trajectories"] else None
    return out
