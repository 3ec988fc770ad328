"""vLLM weight-transfer engine "impala_nccl": the worker end of ``weightsync.nccl.plane``.

What is vLLM's and what is ours:
- vLLM's: the group join (``nccl_common.worker_init_process_group``, unique-id path; it places worker
  w of this engine at ``rank_offset + w``, so TP/PP/DP workers each get their own rank), the init-info
  schema and its unique-id check (``NCCLWeightTransferInitInfo``), the dense receive
  (``NCCLWeightTransferEngine.receive_weights``: vLLM's packed consumer feeding ``model.load_weights``)
  and the sparse receive (``SparseNCCLWeightTransferEngine.receive_weights``: indices/values patches
  applied in place by ``load_checkpoint_weight_patches``). We hold one of each of vLLM's engines and
  hand both the same communicator.
- Ours: one backend name for both kinds (the update info's ``kind`` picks per push, so delta and full
  pushes share one group), a delta received in chunks that bound its memory (``sparse_update_infos``),
  the control-plane fields and liveness of ``weightsync.gloo.engine`` (this
  class extends it: worker key, ``Heartbeat``, layerwise-reload bookkeeping and its rollback on
  failure), and deadlines: the rendezvous waits at most ``connect_timeout_s`` (less when the learner
  gives up on the group first: its ``unformed`` key), and a push is watched
  so that the sender's abort key or ``timeout_s`` (+ ``RECEIVER_GRACE_S``) destroys the communicator
  (``ncclCommAbort`` ends the stuck kernels) instead of leaving the worker blocked in NCCL.

Lifecycle per push: ``start_weight_update`` does nothing; ``update_weights`` starts vLLM's layerwise
reload for a ``full`` push only (a delta is applied in place, without reload); ``finish_weight_update``
finalises only if a reload was started. After a failed or aborted push the communicator is gone (the
actor re-inits with the next generation) and the weights are those of no version: vLLM does not roll
back a partial sparse update, and a dense one aborted mid-bucket may have loaded unfinished bytes. The
control plane must follow a failed push with a full one.

This path is unit-tested on CPU with vLLM's NCCL calls replaced by fakes: it has NOT been run on real
GPUs here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import WeightTransferUpdateInfo
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_process_group
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.sparse_nccl_engine import (
    SparseNCCLWeightTransferEngine,
    SparseNCCLWeightTransferUpdateInfo,
)

from weightsync.backends import NCCL_ENGINE_BACKEND
from weightsync.gloo.engine import GlooWeightTransferEngine, save_adapter
from weightsync.liveness import Heartbeat, abort_probe, unformed_probe
from weightsync.nccl.comm import GatedCommunicator, build_ring, call_with_deadline, on_device
from weightsync.nccl.plane import KIND_DELTA, KIND_FULL
from weightsync.protocol import (
    ABORTED_BY_SENDER,
    WeightSyncError,
    connect_store,
    group_store,
    key_joined,
    key_worker,
    process_info,
    set_json,
)

logger = logging.getLogger(__name__)

RECEIVER_GRACE_S = 5.0  # a receiver gives the sender's deadline this much slack before aborting itself
WATCH_PERIOD_S = 0.1  # how often a receiving worker polls the sender's abort key (as the gloo engine does)
PATCH_CHUNK_BYTES = 512 << 20  # receive buffers of one sparse receive call (``sparse_update_infos``)


@dataclass(kw_only=True)
class ImpalaNcclInitInfo(NCCLWeightTransferInitInfo):
    """vLLM's NCCL init info (``rank_offset``, ``world_size``, ``nccl_unique_id_b64``, packed geometry)
    plus the control-plane fields the gloo engine's has; ``NcclPlane.init_info`` produces all of them.
    Only the unique-id rendezvous is accepted: vLLM's TCP alternative pickles."""

    host: str
    port: int
    prefix: str  # the group's secret key prefix (protocol.group_prefix)
    rank: int  # control-plane rank, 1..N
    name: str = ""  # for diagnostics (worker/<rank>); default "impala_nccl rank <rank>"
    timeout_s: float = 60.0
    connect_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.nccl_unique_id_b64:
            raise ValueError("the impala_nccl engine joins only with nccl_unique_id_b64 (from "
                             "NcclPlane.init_info); vLLM's master_address/master_port rendezvous pickles "
                             "and is not used")
        super().__post_init__()


@dataclass
class ImpalaNcclUpdateInfo(WeightTransferUpdateInfo):
    """``{version, seq}`` of the control plane plus ``NcclPlane.update_info``
    (``nccl_plane.nccl_update_info``)."""

    version: int
    seq: int
    kind: str
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    num_updates_list: list[int] | None = None
    deadline_s: float | None = None  # the sender's deadline of this push (None: the init's timeout_s)
    adapter_dir: str | None = None  # a LoRA adapter push (gloo engine's GlooWeightTransferUpdateInfo)

    def __post_init__(self) -> None:
        if self.kind not in (KIND_FULL, KIND_DELTA):
            raise ValueError(f"update kind must be {KIND_FULL!r} or {KIND_DELTA!r}, got {self.kind!r}")
        if self.kind == KIND_DELTA and self.num_updates_list is None:
            raise ValueError("a delta update needs num_updates_list")


class _Collector:
    """Stands in for the model while vLLM's dense receive runs for an adapter push: keeps each received tensor
    (copied out of the receive buffer, to host memory) instead of loading it."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}

    def load_weights(self, weights) -> set[str]:
        for name, t in weights:
            self.tensors[name] = t.to("cpu", copy=True)
        return set(self.tensors)


def dense_update_info(info: ImpalaNcclUpdateInfo) -> NCCLWeightTransferUpdateInfo:
    """vLLM's typed update info for a full push (its constructor checks the list lengths)."""
    return NCCLWeightTransferUpdateInfo(names=info.names, dtype_names=info.dtype_names, shapes=info.shapes)


def sparse_update_infos(info: ImpalaNcclUpdateInfo,
                        chunk_bytes: int = PATCH_CHUNK_BYTES) -> list[SparseNCCLWeightTransferUpdateInfo]:
    """A delta push as vLLM sparse update infos, one per receive call: consecutive patches whose
    receive buffers (an int32 index and a value per changed element) total at most ``chunk_bytes``,
    a larger patch alone; none for a delta that changes nothing (vLLM refuses an empty patch list).

    Why chunks: vLLM's ``SparseNCCLWeightTransferEngine.receive_weights`` allocates the indices and
    values of every patch of its update info and receives them all before it applies any
    (``sparse_nccl_engine.py``). Given a whole delta just under the 1/3 dense fallback of a 7B
    model, that is 7.6e9 x 1/3 x (4 + 2) B = 15.2 GB on each engine's GPU at once, against the
    ~12 GB an 80 GB GPU leaves outside vLLM's 0.85 budget: every delta with more than about
    12 / (7.6 x 6) = 26 % of its elements changed would run the engines out of memory. Received in
    chunks of 512 MiB (the loader's own batch target, ``checkpoint_weight_patch``), what a delta
    holds at once is one chunk, or one patch: at most 3 x its tensor's dense size (every element
    changed; 3.3 GB for the 1.09 GB embedding), plus the transients of applying it as before (a
    full-shape tensor per loader batch, an index sort). The wire and the sender do not change: the
    patches arrive in the same order, and the receives of chunk k+1 start when chunk k is applied."""
    chunks: list[SparseNCCLWeightTransferUpdateInfo] = []
    start, total = 0, 0
    for i, (dtype, n) in enumerate(zip(info.dtype_names, info.num_updates_list, strict=True)):
        size = n * (4 + getattr(torch, dtype).itemsize)
        if i > start and total + size > chunk_bytes:
            chunks.append(_sparse_slice(info, start, i))
            start, total = i, 0
        total += size
    if start < len(info.names):
        chunks.append(_sparse_slice(info, start, len(info.names)))
    return chunks


def _sparse_slice(info: ImpalaNcclUpdateInfo, lo: int, hi: int) -> SparseNCCLWeightTransferUpdateInfo:
    return SparseNCCLWeightTransferUpdateInfo(names=info.names[lo:hi], dtype_names=info.dtype_names[lo:hi],
                                              shapes=info.shapes[lo:hi],
                                              num_updates_list=info.num_updates_list[lo:hi])


class ImpalaNcclWeightTransferEngine(GlooWeightTransferEngine):
    init_info_cls = ImpalaNcclInitInfo
    update_info_cls = ImpalaNcclUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module):
        super().__init__(config, vllm_config, device, model)
        self._dense = NCCLWeightTransferEngine(config, vllm_config, device, model)
        self._sparse = SparseNCCLWeightTransferEngine(config, vllm_config, device, model)
        self._comm_lock = threading.Lock()

    # ------------------------------------------------------------------ group
    @property
    def communicator(self):
        return self._dense.model_update_group

    def init_transfer_engine(self, init_info: ImpalaNcclInitInfo) -> None:
        """Register with the control plane (worker key, heartbeat), then join the NCCL group; a
        re-init first destroys the previous communicator. Every worker of the engine (TP/PP/DP) runs
        this, joins at its own rank and bumps the same heartbeat."""
        self.shutdown()
        self._info = init_info
        self._store = group_store(connect_store(init_info.host, init_info.port, init_info.connect_timeout_s),
                                  init_info.prefix)
        set_json(self._store, key_worker(init_info.rank),
                 process_info(init_info.name or f"{NCCL_ENGINE_BACKEND} rank {init_info.rank}"))
        self._heartbeat = Heartbeat(init_info.host, init_info.port, init_info.rank, init_info.prefix)

        def join():  # joined, then the broadcast ring built while every rank is here (comm.build_ring)
            with on_device(self.device):
                return build_ring(worker_init_process_group(init_info, self.parallel_config))

        try:  # ends early when the learner gives up on the group (F1: the join holds the engine core)
            comm = GatedCommunicator(call_with_deadline(join, init_info.connect_timeout_s,
                                                        f"rank {init_info.rank}: NCCL rendezvous with the learner",
                                                        cancelled=unformed_probe(self._store),
                                                        on_late=lambda late: late.destroy()))
        except WeightSyncError:
            self.shutdown()  # no group: stop beating, so the control plane does not count us alive
            raise
        self._dense.packed = init_info.packed
        self._dense.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
        self._dense.packed_num_buffers = init_info.packed_num_buffers
        self._dense.model_update_group = self._sparse.model_update_group = comm
        logger.info("impala_nccl weight transfer: rank %d joined the NCCL group (offset %d of %d)",
                    init_info.rank, init_info.rank_offset, init_info.world_size)

    def _drop_communicator(self) -> None:
        """Destroy the communicator (its gate closes, then vLLM's ``destroy``: ``ncclCommAbort``; a
        receive it wakes fails at its next broadcast, ``comm.GatedCommunicator``); idempotent, any
        thread."""
        with self._comm_lock:
            comm = self._dense.model_update_group
            self._dense.model_update_group = self._sparse.model_update_group = None
        if comm is not None:
            with contextlib.suppress(Exception):
                comm.destroy()

    def shutdown(self) -> None:
        super().shutdown()
        self._drop_communicator()

    # ------------------------------------------------------------------ push
    def update_weights(self, update_info: dict) -> None:
        info = self.parse_update_info(update_info)
        self._require_communicator()
        self._store.add(key_joined(info.seq, self._info.rank), 1)  # in the push: a rank never here is named
        try:
            self._watched(info.seq, lambda: self.receive_weights(info), info.deadline_s)
        except BaseException:  # also a loader error the watcher never saw: the group's sequence is broken
            self._abandon_reload()
            self._drop_communicator()
            raise

    def receive_weights(self, update_info: ImpalaNcclUpdateInfo) -> None:
        """``full``: start vLLM's layerwise reload and run vLLM's packed dense receive; ``delta``: vLLM's
        sparse receive, in place, one call per chunk of patches (``sparse_update_infos``). Then wait
        for the device (vLLM's base ``update_weights`` does the same; skipped off CUDA, where there is
        nothing to wait for)."""
        self._require_communicator()
        if update_info.adapter_dir is not None:
            if update_info.kind != KIND_FULL:
                raise WeightSyncError(f"rank {self._info.rank}: an adapter push (#{update_info.seq}) is always "
                                      "dense")
            received = _Collector()
            self._dense.model, model = received, self._dense.model  # vLLM's receive feeds model.load_weights
            try:
                self._dense.receive_weights(dense_update_info(update_info))
            finally:
                self._dense.model = model
            save_adapter(received.tensors, update_info.adapter_dir)
        elif update_info.kind == KIND_FULL:
            typed = dense_update_info(update_info)
            self._begin_reload()
            self._dense.receive_weights(typed)
        else:
            for chunk in sparse_update_infos(update_info):
                self._sparse.receive_weights(chunk)
        if self.device.type == "cuda":
            torch.accelerator.synchronize()

    def _require_communicator(self) -> None:
        if self.communicator is None or self._info is None or self._store is None:
            raise RuntimeError("impala_nccl weight transfer not initialised, or aborted by a failed push: "
                               "call init_weight_transfer_engine first")

    def _watched(self, seq: int, receive, deadline_s: float | None = None) -> None:
        """Run ``receive`` while a watcher thread destroys the communicator when the sender aborts
        push ``seq`` (its abort key) or the push outlives its ``deadline_s`` (the sender's, which grows with
        the push's bytes; default ``timeout_s``) + ``RECEIVER_GRACE_S``; NCCL then
        ends the stuck kernels and ``receive`` returns or raises. Raises ``WeightSyncError`` whenever
        the watcher fired (what was received is not trusted)."""
        probe = abort_probe(self._store, seq)
        limit = (deadline_s or self._info.timeout_s) + RECEIVER_GRACE_S
        deadline = time.monotonic() + limit
        stop = threading.Event()
        fired: list[str] = []

        def watch() -> None:
            while not stop.wait(WATCH_PERIOD_S):
                msg = probe()
                why = (f"{ABORTED_BY_SENDER}: {msg}" if msg
                       else f"push #{seq} not received within {limit:.1f} s" if time.monotonic() > deadline
                       else None)
                if why is not None:
                    fired.append(why)
                    self._drop_communicator()
                    return

        watcher = threading.Thread(target=watch, name=f"weightsync-nccl-watch-{seq}", daemon=True)
        watcher.start()
        try:
            receive()
        except BaseException as e:
            if fired:
                raise WeightSyncError(f"rank {self._info.rank}: {fired[0]}; NCCL communicator aborted") from e
            raise
        finally:
            stop.set()
            watcher.join()
        if fired:
            raise WeightSyncError(f"rank {self._info.rank}: {fired[0]}; NCCL communicator aborted")
