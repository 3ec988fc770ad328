"""vLLM general plugin: registers the engine of every weight-sync backend (``weightsync.backends``:
our "gloo" and "impala_nccl" engines) with vLLM's ``WeightTransferEngineFactory``.

Why an entry point: the engine is instantiated inside vLLM's worker process (spawned, so nothing the
actor imports reaches it). vLLM calls every ``vllm.general_plugins`` entry point in each of its
processes, which is the supported way to make a custom backend name resolvable there. Registration
is lazy (module path + class name), so loading the plugin imports nothing heavy. Idempotent: vLLM
may load plugins more than once per interpreter.
"""

from __future__ import annotations


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from weightsync import backends

    for b in backends.registered():
        if b.engine_backend not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(b.engine_backend, *backends.split_path(b.engine))
