"""Weight sync learner -> vLLM actors over vLLM's native weight-transfer API.

Learner side (torch only, safe to import without vllm): ``WeightSender``, ``full_named_tensors``,
``drain``, ``WeightSyncError``. Actor side (imports vllm lazily): ``weightsync.receiver.WeightReceiver``
and the vLLM engines of the backends in ``weightsync.backends`` (gloo: ``weightsync.gloo.engine``,
nccl: ``weightsync.nccl.engine``), registered with vLLM by the ``vllm.general_plugins`` entry point
``weightsync.plugin:register``. Imports are lazy, so ``weightsync.backends`` (the backend names) is
read without importing torch.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "WeightSender": "weightsync.sender",
    "drain": "weightsync.sender",
    "full_named_tensors": "weightsync.sender",
    "WeightSyncError": "weightsync.protocol",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'weightsync' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
