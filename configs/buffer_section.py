"""The `buffer:` section: the staleness bound (fixed, or chosen by the run: `max_staleness: auto`), the
buffer's capacity and group filter, and where its service listens."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from buffer.settings import FILTERS
from configs.base import Section

AUTO_START = 1  # versions: the K `max_staleness: auto` starts from (K = 0 always makes the learner wait)
CAPACITY_FLOOR_GROUPS = 256  # `capacity_groups: auto` never gives less (the fixed default it replaced)
ACTOR_CREDIT_GROUPS = 32  # groups of room per actor under `capacity_groups: auto`: a 7B engine on an 80 GB GPU holds
# ~223 sequences of 1024 + 3072 tokens (configs/concurrency.py's H100 figure), 27 prompts at n 8; 32 covers that,
# and 256 / 32 = 8 actors keep exactly the capacity of before


def auto_capacity_groups(actors: int) -> int:
    """`buffer.capacity_groups: auto`: max(CAPACITY_FLOOR_GROUPS, ACTOR_CREDIT_GROUPS × actors)."""
    return max(CAPACITY_FLOOR_GROUPS, ACTOR_CREDIT_GROUPS * actors)


class BufferConfig(Section):
    max_staleness: int = Field(
        1, ge=0, description="K: a row whose oldest token is more than K versions behind the learner is never "
                             f"trained on; 0 = synchronous; auto = start at {AUTO_START} with max_staleness_auto")
    max_staleness_auto: bool = Field(
        False, description="raise K while the learner waits for data: from the wait and step times it measures "
                           "(launch/loop/staleness_auto.py), every few steps, never lowering it, up to max_staleness_cap; "
                           "max_staleness is where K starts")
    max_staleness_cap: int = Field(4, ge=0, description="versions: the largest K max_staleness_auto may choose")
    capacity_groups: int | Literal["auto"] = Field(
        "auto", description="groups (prompts) the buffer holds, stored + credited in flight, before back-pressure; "
                            f"auto = max({CAPACITY_FLOOR_GROUPS}, {ACTOR_CREDIT_GROUPS} × rollout.num_actors), "
                            "decided when the config is read (config.yaml records the number): the credit window "
                            "W = min((K + 1) × learner.batch_prompts, this) grows with the actors instead of "
                            "leaving 32 GPU engines 8 prompts each")

    @field_validator("capacity_groups")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if v != "auto" and v <= 0:
            raise ValueError(f"expects 'auto' or a number of groups > 0, got {v}")
        return v
    filter: Literal[FILTERS] = Field(
        "none", description="group filter: drop all-0/all-1 groups, or keep acc_lo ≤ mean ≤ acc_hi")
    acc_lo: float = Field(0.2, ge=0, le=1, description="accuracy_window lower bound (inclusive)")
    acc_hi: float = Field(0.8, ge=0, le=1, description="accuracy_window upper bound (inclusive)")
    max_message_mb: float = Field(64.0, gt=0, description="largest accepted wire message, MiB")
    host: str = Field(
        "auto", description="where the buffer listens: auto = loopback (127.0.0.1) when the run is one machine; on a "
                            "cluster every interface (0.0.0.0), and actors are told the driver node's IP as Ray "
                            "reports it. An IPv4 address binds that interface and is what clients use (0.0.0.0: every "
                            "interface, clients told the node IP, or loopback on one machine); a loopback address is "
                            "refused on a cluster. Connections are authenticated with the run's CURVE keys either way")
    port: int = Field(0, ge=0, lt=65536, description="TCP port; 0 = pick a free one (a restarted buffer keeps it)")
    snapshot_every_s: float = Field(
        60.0, ge=0, description="seconds between the driver's snapshots of the buffer to run_dir/buffer/ (also one "
                                "with every checkpoint); a buffer process that dies is restarted from the latest. "
                                "0 = only with checkpoints")

    @model_validator(mode="before")
    @classmethod
    def _auto(cls, values: Any) -> Any:
        """`max_staleness: auto` is max_staleness_auto from K = AUTO_START (what config.yaml then records)."""
        if isinstance(values, dict) and values.get("max_staleness") == "auto":
            values = {**values, "max_staleness": AUTO_START, "max_staleness_auto": True}
        return values

    @field_validator("host")
    @classmethod
    def _auto_or_ipv4(cls, v: str) -> str:
        import ipaddress

        if v != "auto":
            try:
                ipaddress.IPv4Address(v)
            except ValueError:
                raise ValueError(f"{v!r} is neither 'auto' nor an IPv4 address; use auto, 0.0.0.0 or one of this "
                                 f"node's IPs") from None
        return v
