"""One multi-turn trajectory, token in and token out: policy turns as sampled, observations tokenized once.

The loop (`run_episode`), engine-agnostic (the actor passes `generate`, which runs one vLLM request):

    tokens = []                                              # the response: turns and observations
    for turn in 1..max_turns:
        out = generate(prompt + tokens, min(budget - len(tokens), max_turn_tokens))  # a new request: the ids so far
        tokens += out.tokens     (policy: its log mu, its weight versions)
        stop unless out ended with eos, or was cut at max_turn_tokens with budget left
        observation, reward, done = step(text of this turn)      # tools called, or the environment's step
        stop if done, or after the last turn
        tokens += render(observation)   (environment: version -1, log mu 0; tokenized once)

Every policy token keeps the version of the request that sampled it (vLLM's weight-version spans), so a
push between two turns makes the later turns newer, and log mu stays per token. The policy's tokens are
never decoded and re-encoded: its text is decoded only to find tool calls and to score the reward.

How a trajectory ends (`Trajectory.ended`, also its `Sample.finish_reason`):
  stop           a turn without a tool call (tools), or the environment said done
  length         the policy's turn hit the trajectory's token budget (`Sample.truncated`, as single-turn
                 "length"); a turn cut at env.max_turn_tokens goes on: the template's end of turn (eos
                 included) is appended with the observation, as environment tokens
  max_turns      the last allowed turn still called a tool / the environment was not done
  env_error      a tool or the environment raised                       (counted in env/errors)
  env_timeout    a tool call, reset or step outlasted env.call_timeout_s   (env/timeouts)
  env_truncated  an observation over env.max_observation_tokens or the budget left (env/truncated)
A trajectory the environment ended is still a row: its tokens so far, its reward so far. The actor, its
engine and the other trajectories go on.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from buffer.records import ENV_VERSION, Sample
from envs.tool_calls import parse_tool_calls
from envs.tools import Toolbox, ToolCallError

CHARS_PER_TOKEN_CAP = 32  # an observation with more characters than this × its token limit is not tokenized


@dataclass
class Turn:
    """What one policy request returned: token ids, log mu and weight version of each, and vLLM's finish."""

    tokens: list[int]
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: str


@dataclass
class Limits:
    max_turns: int
    max_tokens: int  # response tokens of the whole trajectory
    max_observation_tokens: int
    timeout_s: float
    max_turn_tokens: int | None = None  # policy tokens of one turn; None = the trajectory's budget left


@dataclass
class Trajectory:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[np.ndarray] = field(default_factory=list)
    env: list[np.ndarray] = field(default_factory=list)
    reward: float = 0.0  # the sum of the steps' rewards
    ended: str = "stop"
    turns: int = 0
    tool_calls: int = 0
    bad_calls: int = 0
    fault: str | None = None  # what ended it, when the environment's side did

    def add(self, tokens: list[int], logprobs, versions, env: bool) -> None:
        self.tokens.extend(tokens)
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.versions.append(np.asarray(versions, np.int32))
        self.env.append(np.full(len(tokens), env, dtype=bool))

    def sample(self, reward: float) -> Sample:
        """The training row (reward given: the episode's, as the actor scored it)."""
        def cat(parts: list[np.ndarray], dtype) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        tokens = np.asarray(self.tokens, np.int32)
        return Sample(tokens=tokens, logprobs=cat(self.logprobs, np.float32), versions=cat(self.versions, np.int32),
                      prefix_mask=np.zeros(len(tokens), bool), reward=float(reward), finish_reason=self.ended,
                      truncated=self.ended == "length", env_mask=cat(self.env, bool))


class EnvFault(Exception):
    """The environment's side failed: `reason` is errors, timeouts or truncated (the env/<reason> count)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


async def call_with_timeout(fn: Callable, *args, timeout_s: float, pool=None):
    """`fn(*args)` (sync on `pool` (None: the loop's default executor), or awaited when async) within
    `timeout_s`; `EnvFault` when it raises or outlasts it."""
    try:
        if inspect.iscoroutinefunction(fn):
            work = fn(*args)
        else:
            work = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        return await asyncio.wait_for(work, timeout_s)
    except asyncio.TimeoutError:
        raise EnvFault("timeouts", f"{getattr(fn, '__qualname__', fn)} took longer than {timeout_s:g} s") from None
    except Exception as e:
        raise EnvFault("errors", f"{getattr(fn, '__qualname__', fn)} raised {type(e).__name__}: {e}") from e


class ToolSteps:
    """`step` of a tools episode: the turn's tool calls run concurrently, results as tool messages."""

    def __init__(self, toolbox: Toolbox):
        self.toolbox = toolbox

    async def step(self, action: str, trajectory: Trajectory) -> tuple[list[dict], float, bool]:
        calls = parse_tool_calls(action)
        if not calls:
            return [], 0.0, True

        async def one(call) -> str:
            if call.error is not None:
                trajectory.bad_calls += 1
                return call.error
            if (why := self.toolbox.bad_call(call.name, call.arguments)) is not None:
                trajectory.bad_calls += 1
                return why
            trajectory.tool_calls += 1
            try:
                return await self.toolbox.call(call.name, call.arguments)
            except asyncio.TimeoutError:
                raise EnvFault("timeouts", f"tool {call.name} took longer than {self.toolbox.timeout_s:g} s") from None
            except ToolCallError as e:
                raise EnvFault("errors", str(e)) from e

        results = await asyncio.gather(*(one(c) for c in calls))
        return [{"role": "tool", "name": c.name, "content": r} for c, r in zip(calls, results)], 0.0, False


class ClassSteps:
    """`step` of an environment-class episode (`envs.environment`): its observation as a user message."""

    def __init__(self, env, timeout_s: float):
        self.env, self.timeout_s = env, timeout_s

    async def step(self, action: str, trajectory: Trajectory) -> tuple[list[dict], float, bool]:
        out = await call_with_timeout(self.env.step, action, timeout_s=self.timeout_s)
        try:
            obs, reward, done = out
            reward = float(reward)
        except (TypeError, ValueError):
            raise EnvFault("errors", f"step returned {out!r:.200}, expected (observation, reward, done)") from None
        if obs is not None and not isinstance(obs, str):
            raise EnvFault("errors", f"step returned a {type(obs).__name__} observation, expected str")
        if not np.isfinite(reward):
            raise EnvFault("errors", f"step returned the reward {reward}")
        return ([{"role": "user", "content": obs}] if obs else []), reward, bool(done)


Generate = Callable[[list[int], int], Awaitable[Turn]]
ENDED = {"errors": "env_error", "timeouts": "env_timeout", "truncated": "env_truncated"}  # EnvFault.reason -> ended


async def run_episode(prompt: list[int], generate: Generate, steps, render: Callable[[list[dict]], Awaitable[list[int]]],
                      decode: Callable[[list[int]], Awaitable[str]], limits: Limits) -> Trajectory:
    """Run one trajectory (module docstring); never raises for the environment's faults (they end it).
    `generate`'s own errors (an aborted or dropped request) propagate: the actor drops the whole group.
    `render` and `decode` are awaited (the actor runs them on a thread: per-token work stays off the loop)."""
    traj = Trajectory()
    for turn in range(limits.max_turns):
        room = limits.max_tokens - len(traj.tokens)
        cap = min(room, limits.max_turn_tokens or room)
        out = await generate(prompt + traj.tokens, cap)
        traj.add(out.tokens, out.logprobs, out.versions, env=False)
        traj.turns += 1
        closed = out.finish_reason == "stop"
        if not closed and (cap == room or out.finish_reason != "length"):
            traj.ended = "length"
            return traj
        try:
            messages, reward, done = await steps.step(await decode(out.tokens), traj)
            traj.reward += reward
            if done:
                return traj
            if turn == limits.max_turns - 1:
                traj.ended = "max_turns"
                return traj
            obs = await observation_ids(messages, render, limits, limits.max_tokens - len(traj.tokens), closed)
        except EnvFault as e:
            traj.ended, traj.fault = ENDED[e.reason], str(e)
            return traj
        traj.add(obs, np.zeros(len(obs)), np.full(len(obs), ENV_VERSION), env=True)
    return traj


async def observation_ids(messages: list[dict], render, limits: Limits, room: int, closed: bool = True) -> list[int]:
    """The observation's token ids; `EnvFault("truncated")` when it is over the observation limit or leaves no
    room for another policy token."""
    chars = sum(len(str(m.get("content", ""))) for m in messages)
    cap = limits.max_observation_tokens
    if chars > CHARS_PER_TOKEN_CAP * cap:
        raise EnvFault("truncated", f"an observation of {chars} characters (limit {cap} tokens)")
    ids = await render(messages, closed)
    if len(ids) > cap or len(ids) >= room:
        raise EnvFault("truncated", f"an observation of {len(ids)} tokens (limit {cap}; {room} left in the "
                                    "trajectory, one kept for the policy)")
    return ids
