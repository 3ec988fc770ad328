"""The chaos bench's environment fault (issue 39 item 5; bench/chaos/chaos.py `--faults env`): an environment whose
one call raises on ~10 % of calls and hangs past `env.call_timeout_s` on ~5 %, the rest answering at once.

Which calls fail is deterministic: the fate of a call is a hash of (prompt, call number, the policy's text), so a
run's faults can be read back from its inputs and do not depend on timing or on a random state. The trajectory's
episode is two policy turns, as bench/e2e/sleep_env.py's (the quick-start's tiny model writes no tool call, so the
fault sits in the environment's `step`, which is called after every turn):

    turn 1 (the model's answer) -> step: raises (~10 %), hangs (~5 %) or answers "ok" at once
    turn 2 (anything)           -> step: done; the episode's reward: turn 1's last \\boxed{} equals the answer

A raise ends the trajectory counted in env/errors, a hang is cut at env.call_timeout_s and counted in
env/timeouts (envs/episode.py); the hang is an asyncio sleep, so the cut frees it at once. Named
`env.environment=bench/chaos/chaos_env.py:FlakyStep`.
"""

from __future__ import annotations

import asyncio
import hashlib

RAISE_SHARE, HANG_SHARE = 0.10, 0.05
HANG_S = 3600.0  # far past any env.call_timeout_s: the episode's timeout cuts it


class ChaosEnvError(RuntimeError):
    """The injected failure of an environment call."""


def call_fate(prompt_index: int, call: int, action: str) -> str:
    """"raise", "hang" or "ok" for one call: the first 8 bytes of sha256(prompt/call/action) as a fraction u of
    2**64; u < RAISE_SHARE raises, u < RAISE_SHARE + HANG_SHARE hangs."""
    digest = hashlib.sha256(f"{prompt_index}/{call}/{action}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    return "raise" if u < RAISE_SHARE else "hang" if u < RAISE_SHARE + HANG_SHARE else "ok"


class FlakyStep:
    def reset(self, record: dict) -> None:
        self.truth, self.prompt, self.reward, self.calls = record["ground_truth"], record["prompt_index"], 0.0, 0
        return None

    async def step(self, action: str) -> tuple[str, float, bool]:
        from tasks.boxed import last_boxed

        self.calls += 1
        if self.calls > 1:
            return "", self.reward, True
        fate = call_fate(self.prompt, self.calls, action)
        if fate == "raise":
            raise ChaosEnvError(f"chaos: environment call {self.calls} of prompt {self.prompt} fails by design")
        if fate == "hang":
            await asyncio.sleep(HANG_S)
        self.reward = float(last_boxed(action) == self.truth)
        return "ok", 0.0, False
