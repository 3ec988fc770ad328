"""The `rollout.deadlines:` section: how long a rollout request may go without progress, how long one attempt at
a group's generation may take, and how often its aborted members are regenerated (`actors.deadlines`, which
also states the `auto` rule)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from configs.base import Section

Seconds = float | Literal["auto"] | None


def _seconds(value, key: str):
    """'auto', null or seconds > 0 (one message naming the fix, not one per union member). A boolean is
    refused: YAML reads `off` as false, and null is how a deadline is turned off."""
    if value is None or value == "auto":
        return value
    if not isinstance(value, bool) and isinstance(value, int | float) and value > 0:
        return float(value)
    got = str(value).lower() if isinstance(value, bool) else repr(value)
    raise ValueError(f"expects auto, null (none) or seconds > 0, got {got} — set rollout.deadlines.{key}=auto, "
                     "a number of seconds, or null to turn it off")


class DeadlinesConfig(Section):
    progress_s: Seconds = Field(
        "auto", description="a rollout sequence that has started decoding and gets no new token for this long is "
                            "aborted and regenerated; so are all of an actor's sequences when its engine produced no "
                            "token at all for this long, and the actor then reports its engine dead (the driver "
                            "replaces it); time paused for weight pushes does not count. auto = max(30 s, 32 of the "
                            "engine's measured seconds per token), 120 s until a first request was measured; null = "
                            "none (actors/deadlines.py). Seconds")
    group_s: Seconds = Field(
        "auto", description="wall budget of one attempt at a group's generation: its members still unfinished "
                            "past it are aborted and regenerated. auto = max(120 s, 4 × rollout.max_response_tokens "
                            "× the measured seconds per token), none until a first request was measured; null = "
                            "none. Seconds")
    retries: int = Field(
        2, ge=0, description="times a group's aborted members are regenerated (same prompt, same actor); past it "
                             "the group is dropped, never delivered in part, and its prompt goes back to the "
                             "actor's shard to be generated again")

    @field_validator("progress_s", "group_s", mode="before")
    @classmethod
    def _auto_null_or_seconds(cls, value, info):
        return _seconds(value, info.field_name)
