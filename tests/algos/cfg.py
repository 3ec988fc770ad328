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


def backprop_all_losses(spec, cfg, batch, adv):
    """Run every loss component of `spec` on `batch` (π_θ = π_prox + 0.01) and backpropagate their
    weighted sum; each component's loss must be finite. Returns the log-prob leaf (with .grad)."""
    import torch

    from algos.aggregation import LossNorm
    from algos.batch import LossContext

    logprobs = (batch.old_logprobs + 0.01).clone().requires_grad_(True)
    ctx = LossContext(logprobs=logprobs, entropy=torch.rand(adv.shape) + logprobs * 0, batch=batch,
                      advantages=adv, norm=LossNorm.local(batch.response_mask))
    total = 0.0
    for comp in spec.losses:
        term = comp.fn(ctx, cfg)
        assert torch.isfinite(term.loss)
        total = total + comp.weight(cfg) * term.loss + term.loss * 0
    total.backward()
    return logprobs
