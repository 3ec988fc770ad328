"""Environments whose one call sleeps L seconds of wall time: the tool of `bench/e2e/tool_latency.py`.

Why an environment class and not a tool function: the quick-start's tiny model never writes a tool call, so a
sleeping *tool* would never be called; an environment's `step` is called after every policy turn whatever the
policy wrote, so each trajectory waits exactly once, L seconds, between its two turns:

    turn 1 (the model's answer) -> step: sleeps L s (asyncio.sleep: waiting, no CPU), observation "ok"
    turn 2 (anything)           -> step: done; the episode's reward: turn 1's last \\boxed{} equals the answer

`async def` so that the waits of all trajectories in flight overlap (a plain `def` step runs on the actor's
default thread pool, a handful of threads on a small machine, which would queue them). Named
`env.environment=bench/e2e/sleep_env.py:Sleep1` (and Sleep0, Sleep025).
"""

from __future__ import annotations

import asyncio


class _Sleep:
    seconds = 0.0

    def reset(self, record: dict) -> None:
        self.truth, self.reward, self.calls = record["ground_truth"], 0.0, 0
        return None

    async def step(self, action: str) -> tuple[str, float, bool]:
        from tasks.boxed import last_boxed

        self.calls += 1
        if self.calls == 1:
            self.reward = float(last_boxed(action) == self.truth)
            await asyncio.sleep(self.seconds)
            return "ok", 0.0, False
        return "", self.reward, True


class Sleep0(_Sleep):
    seconds = 0.0


class Sleep025(_Sleep):
    seconds = 0.25


class Sleep1(_Sleep):
    seconds = 1.0
