"""The weight-sync backends by name: each ``weight_sync.backend`` value names a data plane (the learner's
end, ``weightsync.plane.SenderPlane``) and the vLLM weight-transfer engine that receives it (the
actor's end).

This module imports neither torch nor vLLM, so ``configs/`` may take the ``weight_sync.backend``
choices from ``names()`` (as it takes the ``--algo`` choices from ``algos.registry``). Classes are named
by import path and imported only on use: ``plane_class`` on the learner, ``engine_backend`` when an
actor builds its engine, and ``weightsync.plugin`` registers every ``engine`` with vLLM's
``WeightTransferEngineFactory`` inside vLLM's own processes. The "auto" choice is not a backend: the
launcher resolves it to one of these (``launch.planning.resources.resolve_auto``) before anything starts.

Adding a backend: a plane class with a ``for_sender(weightsync.plane.PlaneContext)`` constructor, a
vLLM engine class, and one ``register(Backend(...))`` line at the end of this module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

GLOO_ENGINE_BACKEND = "gloo"  # vLLM backend name of weightsync.gloo.engine
NCCL_ENGINE_BACKEND = "impala_nccl"  # vLLM backend name of weightsync.nccl.engine


@dataclass(frozen=True)
class Backend:
    name: str  # the weight_sync.backend value
    plane: str  # "module:Class" of the learner's data plane (torch only, never vLLM)
    engine_backend: str  # the name the receiving engine is registered under in vLLM
    engine: str  # "module:Class" of that vLLM weight-transfer engine


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    if backend.name in _REGISTRY:
        raise ValueError(f"weight-sync backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown weight-sync backend {name!r}; choose one of {names()}") from None


def names() -> list[str]:
    """The ``weight_sync.backend`` values (besides "auto", which the launcher resolves to one of them)."""
    return sorted(_REGISTRY)


def registered() -> list[Backend]:
    return [_REGISTRY[n] for n in names()]


def split_path(path: str) -> tuple[str, str]:
    """``"module:Class"`` -> ``("module", "Class")``."""
    module, _, attr = path.partition(":")
    return module, attr


def plane_class(name: str) -> type:
    """The data-plane class of backend ``name`` (imports its module)."""
    module, attr = split_path(get(name).plane)
    return getattr(importlib.import_module(module), attr)


register(Backend("gloo", "weightsync.gloo.plane:GlooPlane", GLOO_ENGINE_BACKEND,
                 "weightsync.gloo.engine:GlooWeightTransferEngine"))
register(Backend("nccl", "weightsync.nccl.plane:NcclPlane", NCCL_ENGINE_BACKEND,
                 "weightsync.nccl.engine:ImpalaNcclWeightTransferEngine"))
