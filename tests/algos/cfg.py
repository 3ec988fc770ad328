"""Real `RunConfig`s for the algorithm tests (so the schema and `algos/` cannot drift apart)."""

from __future__ import annotations

from configs.schema import RunConfig


def make_cfg(algo: str, loss: dict | None = None, **section) -> RunConfig:
    """Schema defaults for `algo`, with `loss.*` and `<algo>.*` fields overridden (validated)."""
    cfg = RunConfig(algo="grpo").model_copy(deep=True)
    for key, value in (loss or {}).items():
        setattr(cfg.loss, key, value)
    target = getattr(cfg, algo)
    for key, value in section.items():
        setattr(target, key, value)
    return cfg
