"""The data-plane contract of the weight sync: how the bytes of one push travel from learner rank 0 to the
engines.

The control plane (``weightsync.sender.WeightSender``: admission, push announcements, acks/nacks,
abort keys, heartbeats, deadlines, failure diagnosis) is the same for every backend; a data plane is
the small piece that forms the transfer group and broadcasts a ``Payload``:
  - ``GlooPlane`` (``weightsync.gloo.plane``): CPU, gloo over TCP, bucketed (``weightsync.packing``) into our vLLM engine
    ``weightsync.gloo.engine`` (registered as backend "gloo"); what CI runs;
  - an NCCL plane (``weightsync.nccl.plane``) into vLLM's own NCCL engines on GPUs.
Each is registered by name with its engine in ``weightsync.backends``, and the sender builds the one
the run names with ``for_sender(PlaneContext)``.
Contract with the control plane: ``init_info(rank)`` is published (JSON, under the group's secret
prefix) before that receiver is admitted, and the receiver passes it unchanged as the init_info of
``init_weight_transfer_engine``; ``connect`` runs while the receivers join inside that call;
``update_info(payload)`` is published with the push announcement and the receiver passes
``{"version", "seq", **update_info}`` to ``update_weights``; ``send`` must honour its deadline and
raise ``WeightSyncError`` past it (never hang); ``abort`` destroys the group and is idempotent.
``send`` must ``payload.wait_ready()`` before reading the payload's tensors (staged host copies on a
CUDA learner, ``weightsync.staging``). ``send`` runs on whatever thread calls ``WeightSender.send`` (possibly a background one while the
learner's thread runs FSDP collectives): a plane must never use the default process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from weightsync.packing import Patch
from weightsync.staging import wait_ready

DEFAULT_MIN_GBPS = 0.1  # weight_sync.min_gbps's default: 10^8 bytes/s, about a 1 GbE link


def push_deadline_s(timeout_s: float, nbytes: int, min_gbps: float) -> float:
    """Deadline of a plane's whole push (NCCL's; gloo's is per bucket): ``timeout_s`` (every engine's
    pause, the broadcast's start) plus the time ``nbytes`` take at ``min_gbps`` GB/s (10^9 bytes a
    second), the slowest link the run allows for (``weight_sync.min_gbps``)."""
    return float(timeout_s) + nbytes / (min_gbps * 1e9)


@dataclass
class Payload:
    """One push, already gathered and cast to the wire dtype (rank 0 only). Exactly one of ``full``
    (dense: every tensor) and ``patches`` (delta: only the tensors with changed elements) is set."""

    version: int
    seq: int
    full: list[tuple[str, torch.Tensor]] | None = None
    patches: list[Patch] | None = None
    changed_frac: float = 1.0  # changed elements / all elements (1.0 for a dense push)
    ready: object | None = None  # staging event (``weightsync.staging``): the tensors are valid once it completed

    def wait_ready(self) -> None:
        """Block until the staged tensors are valid (a no-op when nothing was staged: CPU runs)."""
        wait_ready(self.ready)

    def __post_init__(self) -> None:
        if (self.full is None) == (self.patches is None):
            raise ValueError("a Payload carries exactly one of full (dense) and patches (delta)")

    @property
    def mode(self) -> str:
        return "full" if self.full is not None else "delta"


@dataclass(frozen=True)
class PlaneContext:
    """What the control plane gives the data plane it builds (``SenderPlane.for_sender``)."""

    store: dist.Store  # the group's store (the secret prefix applied): receivers read plane keys from it
    host: str  # the sender's advertised address, and its store's port
    port: int
    prefix: str  # the group's secret key prefix (for receivers that open their own store client)
    num_receivers: int  # engines (each of ``tp`` workers)
    tp: int  # workers per engine (TP x PP), for planes that address every worker
    bucket_bytes: int  # largest packed message
    timeout_s: float  # deadline of one push's transfer
    connect_timeout_s: float  # deadline of the rendezvous
    mirror: bool  # delta mode: the engines keep the last dense push and apply patches to it
    min_gbps: float = DEFAULT_MIN_GBPS  # planes with one deadline per push add bytes / this (GB/s) to it


class SenderPlane(Protocol):
    """A data plane, registered by name in ``weightsync.backends``."""

    backend: str  # its weight_sync.backend name (logged, reported in stats)
    engine_backend: str  # WeightTransferConfig backend name the actors' vLLM engines must be built with

    @classmethod
    def for_sender(cls, ctx: PlaneContext) -> SenderPlane: ...

    def init_info(self, rank: int) -> dict: ...

    def connect(self, timeout_s: float) -> None: ...

    def update_info(self, payload: Payload) -> dict: ...

    def send(self, payload: Payload, timeout_s: float) -> dict: ...

    def abort(self) -> None: ...

    # optional: ``patch_cost(changed, numel, itemsize)``, the wire bytes of one tensor's patch (the delta
    # encoder's dense fallback; default: ``weightsync.delta.int32_patch_nbytes``, vLLM's sparse format)
