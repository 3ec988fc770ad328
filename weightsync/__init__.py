"""Weight sync learner -> vLLM actors over vLLM's native weight-transfer API.

Learner side (torch only, safe to import without vllm): ``WeightSender``, ``full_named_tensors``,
``drain``, ``WeightSyncError``. Actor side (imports vllm lazily): ``weightsync.receiver.WeightReceiver``
and the vLLM engine ``weightsync.gloo_engine.GlooWeightTransferEngine`` registered as backend "gloo" by
the ``vllm.general_plugins`` entry point ``weightsync.plugin:register``.
"""

from weightsync.protocol import BACKEND_NAME, WeightSyncError
from weightsync.sender import WeightSender, drain, full_named_tensors

__all__ = ["BACKEND_NAME", "WeightSender", "WeightSyncError", "drain", "full_named_tensors"]
