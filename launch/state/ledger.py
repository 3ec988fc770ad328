"""The prompt ledger: the one owner of prompt progress, so a resumed or restarted run trains every
prompt at most once per epoch and regenerates only what was lost.

A prompt counts as *accepted* once its group is trained (recorded here, step by step), discarded by
the buffer (filtered or dropped as stale; the buffer reports those keys with each pull, so they are
recorded here too) or held by the buffer (whose snapshot travels with the checkpoint). Restarted
actors and resumed runs walk their shard from the top, skip accepted prompts and regenerate
everything else — in flight, in an actor's outbox, or lost with a crashed actor — so no actor's own
report of where it was is needed. Keys are (epoch, prompt_index); the epoch is the actor cursor's
pass over its shard, carried in `group.meta["epoch"]`. Stored in the checkpoint's extra_state as
plain lists (JSON, no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from buffer.records import Key


@dataclass
class PromptLedger:
    trained: dict[Key, int] = field(default_factory=dict)  # (epoch, prompt) -> step it was trained at
    discarded: set[Key] = field(default_factory=set)  # (epoch, prompt) the buffer filtered or dropped

    def record(self, step: int, keys: list[Key]) -> None:
        """Record a step's prompts; a prompt trained twice in an epoch is a bug in the plane that sent it."""
        twice = sorted({k for k in keys if k in self.trained} | {k for k in keys if keys.count(k) > 1})
        if twice:
            raise RuntimeError(f"step {step}: (epoch, prompt) {twice[:5]} would be trained twice (ledger violation)")
        for k in keys:
            self.trained[k] = step

    def discard(self, keys: list[Key]) -> None:
        """Record prompts the buffer discarded: settled for their epoch without being trained."""
        self.discarded.update((int(e), int(i)) for e, i in keys)

    def accepted(self, held_by_buffer: list[Key] = ()) -> list[Key]:
        return sorted(set(self.trained) | self.discarded | {tuple(k) for k in held_by_buffer})

    def state_dict(self) -> dict:
        items = sorted(self.trained.items())
        return {"epochs": [e for (e, _), _ in items], "prompts": [i for (_, i), _ in items],
                "steps": [s for _, s in items], "discarded": sorted([e, i] for e, i in self.discarded)}

    @classmethod
    def from_state_dict(cls, state: dict) -> PromptLedger:
        keys = zip(state.get("epochs", []), state.get("prompts", []))
        return cls({(int(e), int(i)): int(s) for (e, i), s in zip(keys, state.get("steps", []))},
                   {(int(e), int(i)) for e, i in state.get("discarded", [])})
