"""Plain settings of the buffer service, built from the typed run config without importing it.

The buffer may import only zmq, msgpack, numpy and the standard library, so it reads `BufferConfig`
(and `LearnerConfig.batch_prompts`) by attribute or from a dict/JSON and keeps its own dataclass; the
extra knobs here (credit time-to-live, wire limits, dedup window) have defaults that need no config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from buffer.checks import Limits

FILTERS = ("none", "extreme", "accuracy_window")


@dataclass
class BufferSettings:
    max_staleness: int = 1  # K, versions
    capacity_groups: int = 256  # groups stored + credited in flight
    filter: str = "none"
    acc_lo: float = 0.2
    acc_hi: float = 0.8
    max_message_mb: float = 64.0
    host: str = "127.0.0.1"
    port: int = 0
    batch_prompts: int = 8  # groups the learner consumes per version (LearnerConfig.batch_prompts)
    credit_ttl_s: float = 600.0  # credits of a client silent this long are reclaimed; 0 = never
    max_samples_per_group: int = 1024
    max_tokens_per_sample: int = 1 << 20
    max_demo_tokens: int = 1 << 28  # all stored demonstrations together
    dedup_window: int = 1 << 20  # group ids remembered for duplicate detection
    log_every_s: float = 60.0  # stats line in the service log; 0 = never

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_staleness", "port"):
            if int(getattr(self, name)) < 0:
                problems.append(f"buffer.{name}: must be ≥ 0, got {getattr(self, name)}")
        for name in ("capacity_groups", "batch_prompts", "max_samples_per_group", "max_tokens_per_sample",
                     "max_demo_tokens", "dedup_window", "max_message_mb"):
            if getattr(self, name) <= 0:
                problems.append(f"buffer.{name}: must be > 0, got {getattr(self, name)}")
        if self.filter not in FILTERS:
            problems.append(f"buffer.filter: {self.filter!r} is not one of {', '.join(FILTERS)}")
        if not 0 <= self.acc_lo <= self.acc_hi <= 1:
            problems.append(f"buffer.acc_lo/acc_hi: need 0 ≤ acc_lo ≤ acc_hi ≤ 1, got {self.acc_lo}, {self.acc_hi}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def limits(self) -> Limits:
        return Limits(max_message_bytes=int(self.max_message_mb * (1 << 20)),
                      max_samples=self.max_samples_per_group, max_tokens=self.max_tokens_per_sample)

    @property
    def bind_address(self) -> str:
        return f"tcp://{self.host}:{self.port or '*'}"

    @classmethod
    def from_config(cls, cfg=None, batch_prompts: int | None = None, **overrides) -> BufferSettings:
        """From a RunConfig (uses .buffer and .learner.batch_prompts), a BufferConfig, a dict or None."""
        known = {f.name for f in fields(cls)}
        values: dict = {}
        if isinstance(cfg, BufferSettings):
            values = asdict(cfg)
        elif isinstance(cfg, dict):
            buf = cfg.get("buffer", cfg)
            values = {k: v for k, v in buf.items() if k in known}
            if "learner" in cfg and "batch_prompts" in cfg["learner"]:
                values["batch_prompts"] = cfg["learner"]["batch_prompts"]
            unknown = set(buf) - known - {"buffer", "learner"}
            if unknown:
                raise ValueError(f"buffer settings: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        elif cfg is not None:
            buf = getattr(cfg, "buffer", cfg)
            values = {k: getattr(buf, k) for k in known if hasattr(buf, k)}
            learner = getattr(cfg, "learner", None)
            if learner is not None and hasattr(learner, "batch_prompts"):
                values["batch_prompts"] = learner.batch_prompts
        if batch_prompts is not None:
            values["batch_prompts"] = batch_prompts
        values.update(overrides)
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BufferSettings:
        return cls.from_config(json.loads(text))
