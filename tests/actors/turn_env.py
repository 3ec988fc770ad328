"""An environment for the real-engine multi-turn test (`test_actor_turns.py`): every trajectory of a group
takes two turns; between them, once all of the group's trajectories have ended their first turn, the engine's
weight-version label moves to `NEXT_VERSION` (what a weight push between two turns does), so turn 2's tokens
must carry the newer version. Its step also calls a real tool function (`mul`) through a `Toolbox`."""

from __future__ import annotations

import asyncio

from envs.tools import Toolbox

ENGINE = None  # set by the test: the actor's AsyncLLM
GROUP = 2  # trajectories per group (rollout.n of the test)
NEXT_VERSION = 9
_arrived: list[asyncio.Event] = []


def mul(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return str(a * b)


TOOLS = Toolbox([mul], timeout_s=5)


class TwoTurns:
    def __init__(self):
        self.turn = 0

    def reset(self, record):
        return None

    async def step(self, action):
        self.turn += 1
        if self.turn == 1:
            me = asyncio.Event()
            _arrived.append(me)
            if len(_arrived) == GROUP:  # the last of the group: the "push" lands, then all go on
                await ENGINE.update_weight_version(str(NEXT_VERSION))
                for e in _arrived:
                    e.set()
            await me.wait()
            return f"12*34={await TOOLS.call('mul', {'a': 12, 'b': 34})}", 0.25, False
        return "", 0.5, True


class Faults:
    """Trajectory k of a group (by the order of their first steps) raises, hangs past env.call_timeout_s,
    answers a megabyte, or goes on normally."""

    order: list[str] = []

    def reset(self, record):
        return None

    async def step(self, action):
        kinds = ("raise", "hang", "huge", "fine")
        if not hasattr(self, "kind"):
            self.kind = kinds[len(Faults.order) % 4]
            Faults.order.append(self.kind)
        if self.kind == "raise":
            raise RuntimeError("the environment broke")
        if self.kind == "hang":
            await asyncio.sleep(30)
        if self.kind == "huge":
            return "x" * (1 << 20), 0.0, False
        return "", 1.0, True
