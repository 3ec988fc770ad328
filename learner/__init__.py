"""The FSDP2 learner: from groups of rollouts to optimiser steps, checkpoints and full weights.

Public API (everything else is an implementation module):
  Learner(cfg, rank, world_size, model_dir)     one data-parallel rank (learner.learner)
    .step(groups, version) -> metrics            every rank, same groups (mini_batches × epochs optimiser steps)
    .named_full_weights()                        (HF name, full tensor) for the weight-sync sender;
                                                 every rank iterates it (collective)
    .save(path, extra_state) / .load(path)       sharded exact-resume state, every rank its own shards
  latest_checkpoint(checkpoints_dir)             newest committed step_<N> directory
  export_hf(checkpoint, out)                     the policy of a checkpoint as an HF model directory
  PROVIDERS / register_provider                  StepBatch inputs by name (learner.providers)
  ProcessRewardModel, RuleStepChecker, HFTokenClassificationPRM   PURE's PRM interface (learner.prm.pure)
Imports are lazy so `import learner` stays cheap and torch.distributed is touched only on use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Learner": "learner.learner",
    "latest_checkpoint": "learner.checkpoint",
    "export_hf": "learner.checkpoint",
    "PROVIDERS": "learner.providers",
    "register_provider": "learner.providers",
    "ProcessRewardModel": "learner.prm.pure",
    "RuleStepChecker": "learner.prm.pure",
    "HFTokenClassificationPRM": "learner.prm.pure",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'learner' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
