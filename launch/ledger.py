"""The prompt ledger: which training prompts have been trained on, so a resumed or restarted run
trains every prompt exactly once per epoch.

A prompt counts as *accepted* once its group is trained (recorded here, step by step) or held by the
buffer (whose snapshot travels with the checkpoint). Restarted actors and resumed runs skip accepted
prompts and regenerate everything else — in flight, in an actor's outbox, or lost with a crashed
actor. Keys are (epoch, prompt_index); the epoch is the actor cursor's pass over its shard, carried
in `group.meta["epoch"]`. Stored in the checkpoint's extra_state as plain lists (JSON, no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Key = tuple[int, int]  # (epoch, prompt_index)


@dataclass
class PromptLedger:
    trained: dict[Key, int] = field(default_factory=dict)  # (epoch, prompt) -> step it was trained at

    def record(self, step: int, keys: list[Key]) -> None:
        """Record a step's prompts; a prompt trained twice in an epoch is a bug in the plane that sent it."""
        twice = sorted({k for k in keys if k in self.trained} | {k for k in keys if keys.count(k) > 1})
        if twice:
            raise RuntimeError(f"step {step}: (epoch, prompt) {twice[:5]} would be trained twice (ledger violation)")
        for k in keys:
            self.trained[k] = step

    def accepted(self, held_by_buffer: list[Key] = ()) -> list[Key]:
        return sorted(set(self.trained) | set(held_by_buffer))

    def state_dict(self) -> dict:
        items = sorted(self.trained.items())
        return {"epochs": [e for (e, _), _ in items], "prompts": [i for (_, i), _ in items],
                "steps": [s for _, s in items]}

    @classmethod
    def from_state_dict(cls, state: dict) -> PromptLedger:
        keys = zip(state.get("epochs", []), state.get("prompts", []))
        return cls({(int(e), int(i)): int(s) for (e, i), s in zip(keys, state.get("steps", []))})
