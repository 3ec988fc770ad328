"""vLLM general plugin: registers our "gloo" and "impala_nccl" engines with vLLM's
``WeightTransferEngineFactory``.

Why an entry point: the engine is instantiated inside vLLM's worker process (spawned, so nothing the
actor imports reaches it). vLLM calls every ``vllm.general_plugins`` entry point in each of its
processes, which is the supported way to make a custom backend name resolvable there. Registration
is lazy (module path + class name), so loading the plugin imports nothing heavy. Idempotent: vLLM
may load plugins more than once per interpreter.
"""

from __future__ import annotations

ENGINE_MODULE = "weightsync.gloo_engine"
ENGINE_CLASS = "GlooWeightTransferEngine"
NCCL_ENGINE_MODULE = "weightsync.nccl_engine"  # registered as nccl_plane.NCCL_ENGINE_BACKEND ("impala_nccl")
NCCL_ENGINE_CLASS = "ImpalaNcclWeightTransferEngine"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from weightsync.protocol import BACKEND_NAME

    if BACKEND_NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND_NAME, ENGINE_MODULE, ENGINE_CLASS)

    from weightsync.nccl_plane import NCCL_ENGINE_BACKEND

    if NCCL_ENGINE_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(NCCL_ENGINE_BACKEND, NCCL_ENGINE_MODULE,
                                                    NCCL_ENGINE_CLASS)
