"""Learner end (rank 0) of the NCCL data plane: the weights go GPU -> GPU through vLLM's NCCL pieces.

What is vLLM's and what is ours:
- vLLM's: the communicator (``PyNcclCommunicator``, joined with ``nccl_common.uid_init_process_group``
  from raw ``ncclUniqueId`` bytes minted by ``pynccl_wrapper.NCCLLibrary.ncclGetUniqueId``), the dense
  wire format (``packed_tensor.packed_nccl_broadcast_producer``, whose buckets the engines unpack with
  the matching consumer), and the two update-info schemas our payloads mirror
  (``NCCLWeightTransferUpdateInfo``, ``SparseNCCLWeightTransferUpdateInfo``). The receiving engine is
  ``weightsync.nccl.engine`` (vLLM's dense and sparse NCCL engines behind one name of ours).
- Ours: the rank plan, the unique-id hand-out, the payload schemas, the bucket plan (a statement of
  vLLM's chunking rule, for the stats and the tests), and the deadline. vLLM's own trainer engines are
  not used: they give every client ``rank_offset`` 1 (one engine per group), rendezvous over a pickling
  ``StatelessProcessGroup`` and wait for a broadcast without a deadline.

Deadlines (``weightsync.nccl.comm``): the rendezvous and every push run on a daemon thread while the
caller waits with the deadline (a push's: ``timeout_s`` + its bytes / ``min_gbps``, also sent to the
receivers in its update info). A push is also cancelled as soon as a receiver nacks or its heartbeat
stops (``push_outcome.push_failure_probe``): a receiver that left the broadcast would otherwise keep
every other engine paused in it until that deadline (212 s for a 7B model at the defaults). On
expiry or a cancel the caller destroys the communicator (``ncclCommAbort``, which ends the stuck
kernels; its gate refuses any later broadcast) and raises ``WeightSyncError``; the thread is
abandoned, never joined. The control plane then names the receivers responsible, and the next
generation (fresh ``init_info`` with a fresh unique id, then ``connect``) destroys whatever is left
of the previous communicator.

Nothing here imports vllm at module level (the learner may run without it); the vLLM calls are
imported where they are made. This path is unit-tested on CPU with a fake communicator only: it has
NOT been run on real GPUs here.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Iterable, Sequence
from functools import partial

import torch
import torch.distributed as dist

from weightsync import packing
from weightsync.backends import NCCL_ENGINE_BACKEND
from weightsync.delta import int32_patch_nbytes
from weightsync.nccl.comm import (
    Communicator,
    CommunicatorFactory,
    GatedCommunicator,
    build_ring,
    call_with_deadline,
    on_device,
    vllm_communicator,
)
from weightsync.packing import Patch
from weightsync.plane import DEFAULT_MIN_GBPS, Payload, PlaneContext, push_deadline_s
from weightsync.protocol import WeightSyncError
from weightsync.push_outcome import push_failure_probe
from weightsync.staging import CUDA, CudaOps, send_stream, using

NCCL_UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId) (vLLM: pynccl_wrapper.NCCL_UNIQUE_ID_BYTES)
KIND_FULL, KIND_DELTA = "full", "delta"
DEFAULT_PACKED_BUFFER_BYTES = 256 << 20  # vLLM defaults to 1 GiB x 2; 256 MiB matches weight_sync.bucket_mb
DEFAULT_NUM_BUFFERS = 2  # vLLM's DEFAULT_PACKED_NUM_BUFFERS

# ---------------------------------------------------------------------------- rank plan
def group_world_size(num_receivers: int, tp: int) -> int:
    """NCCL group size: the learner (rank 0) plus ``tp`` ranks for each of ``num_receivers`` engines."""
    if num_receivers < 1 or tp < 1:
        raise ValueError(f"need num_receivers >= 1 and tp >= 1, got {num_receivers} and {tp}")
    return 1 + num_receivers * tp


def rank_offset(rank: int, num_receivers: int, tp: int) -> int:
    """First NCCL rank of control-plane receiver ``rank`` (1..N): ``1 + (rank - 1) * tp``.

    vLLM's ``worker_init_process_group`` puts worker w of an engine (w = dp_index * TP * PP + rank
    within the DP group) at ``rank_offset + w``, so ``tp`` must count every worker of one engine
    (TP x PP, times the engine's internal DP size if any). Receiver 1 gets ranks 1..tp, receiver 2
    tp+1..2tp, and so on: disjoint, which vLLM's trainer engine (offset 1 for every client) is not."""
    group_world_size(num_receivers, tp)  # validates both
    if not 1 <= rank <= num_receivers:
        raise ValueError(f"receiver rank must be in 1..{num_receivers}, got {rank}")
    return 1 + (rank - 1) * tp


# ---------------------------------------------------------------------------- unique id
def encode_unique_id(unique_id: bytes) -> str:
    """Standard (not URL-safe) base64 of the 128 raw ``ncclUniqueId`` bytes, which is what vLLM's
    ``NCCLWeightTransferInitInfo.nccl_unique_id_b64`` decodes. JSON-safe; nothing is pickled."""
    if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {NCCL_UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    return base64.b64encode(unique_id).decode("ascii")


def mint_unique_id() -> bytes:
    """A fresh ``ncclUniqueId`` from vLLM's NCCL wrapper (needs libnccl, i.e. a GPU build of torch).
    One id serves one rendezvous: NCCL's bootstrap root behind it accepts a single group."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    return bytes(NCCLLibrary().ncclGetUniqueId().internal)


def nccl_init_info(rank: int, num_receivers: int, tp: int, unique_id: bytes, packed_buffer_bytes: int,
                   num_buffers: int) -> dict:
    """The NCCL fields of receiver ``rank``'s ``init_weight_transfer_engine`` payload (vLLM's
    ``NCCLWeightTransferInitInfo`` fields; ``NcclPlane.init_info`` adds the control ones). The
    packed-buffer geometry travels here because producer and consumer must cut the stream identically."""
    return {
        "rank_offset": rank_offset(rank, num_receivers, tp),
        "world_size": group_world_size(num_receivers, tp),
        "nccl_unique_id_b64": encode_unique_id(unique_id),
        "packed": True,
        "packed_buffer_size_bytes": int(packed_buffer_bytes),
        "packed_num_buffers": int(num_buffers),
    }


# ---------------------------------------------------------------------------- update payloads
def dtype_name(name: str, dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the receiver resolves it with ``getattr(torch, name)``).
    Refuses, naming tensor ``name``, a dtype the gloo plane could not send either
    (``packing.dtype_name``): vLLM's packed producer would send any dtype as raw bytes (a complex
    tensor included) and the push would fail only inside every engine's loader, after the engines
    paused; refused here, nothing is announced."""
    try:
        return packing.dtype_name(dtype)
    except TypeError as e:
        raise TypeError(f"tensor {name!r}: {e}") from None


def check_patch(patch: Patch) -> None:
    """Refuse a patch the receiver could not size or vLLM's sparse loader would reject, before any
    byte is sent: int32 1-D flat indices, 1-D floating values (NaN is vLLM's "unchanged" marker),
    as many values as indices."""
    if patch.indices.dtype != torch.int32 or patch.indices.dim() != 1:
        raise ValueError(f"patch {patch.name!r}: indices must be 1-D int32, got {patch.indices.dtype} "
                         f"{tuple(patch.indices.shape)}")
    if patch.values.dim() != 1 or not patch.values.dtype.is_floating_point:
        raise ValueError(f"patch {patch.name!r}: values must be 1-D floating, got {patch.values.dtype} "
                         f"{tuple(patch.values.shape)}")
    if patch.indices.numel() != patch.values.numel():
        raise ValueError(f"patch {patch.name!r}: {patch.indices.numel()} indices but "
                         f"{patch.values.numel()} values")


def nccl_update_info(payload: Payload) -> dict:
    """What every receiver needs to size its receive buffers before the broadcast starts.

    ``full``:  ``{kind, names, dtype_names, shapes}`` (vLLM's ``NCCLWeightTransferUpdateInfo``);
    ``delta``: the same plus ``num_updates_list`` (vLLM's ``SparseNCCLWeightTransferUpdateInfo``), one
    entry per patch; ``shapes`` are the full checkpoint shapes, ``dtype_names`` those of the values.
    (``Payload`` itself guarantees that exactly one of ``full`` and ``patches`` is set.) Raises
    ``TypeError`` for a dtype that cannot be sent and ``ValueError`` for a malformed patch."""
    if payload.full is not None:
        return {"kind": KIND_FULL,
                "names": [n for n, _ in payload.full],
                "dtype_names": [dtype_name(n, t.dtype) for n, t in payload.full],
                "shapes": [list(t.shape) for _, t in payload.full]}
    for p in payload.patches:
        check_patch(p)
    return {"kind": KIND_DELTA,
            "names": [p.name for p in payload.patches],
            "dtype_names": [dtype_name(p.name, p.values.dtype) for p in payload.patches],
            "shapes": [list(p.shape) for p in payload.patches],
            "num_updates_list": [p.indices.numel() for p in payload.patches]}


# ---------------------------------------------------------------------------- bucket plan
def bucket_plan(nbytes: Sequence[int], buffer_bytes: int) -> list[list[int]]:
    """Which tensors (indices into ``nbytes``, in order) share each packed broadcast.

    vLLM's rule, applied identically by ``pack_tensors`` (producer) and
    ``packed_nccl_broadcast_consumer``: append tensors in order and close the bucket right after the
    tensor that makes its total exceed ``buffer_bytes`` (strictly); the rest forms the last bucket.
    So a bucket exceeds ``buffer_bytes`` by less than its last tensor, and one reaching exactly
    ``buffer_bytes`` stays open."""
    plan: list[list[int]] = []
    bucket: list[int] = []
    total = 0
    for i, n in enumerate(nbytes):
        bucket.append(i)
        total += n
        if total > buffer_bytes:
            plan.append(bucket)
            bucket, total = [], 0
    if bucket:
        plan.append(bucket)
    return plan


def send_stats(payload: Payload, buffer_bytes: int) -> dict:
    """``{bytes, buckets, tensors}`` of one push: ``buckets`` counts broadcasts (packed buffers for a
    dense push; one for the indices and one for the values of every patch for a delta)."""
    if payload.full is not None:
        sizes = [t.numel() * t.element_size() for _, t in payload.full]
        return {"bytes": sum(sizes), "buckets": len(bucket_plan(sizes, buffer_bytes)), "tensors": len(sizes)}
    patches = payload.patches
    return {"bytes": sum(p.indices.numel() * p.indices.element_size()
                         + p.values.numel() * p.values.element_size() for p in patches),
            "buckets": 2 * len(patches), "tensors": len(patches)}


# ---------------------------------------------------------------------------- transmit (rank 0)
def broadcast_full(comm: Communicator, named: Iterable[tuple[str, torch.Tensor]], buffer_bytes: int,
                   num_buffers: int) -> None:
    """Dense push through vLLM's ``packed_nccl_broadcast_producer`` from rank 0 (it drains its own
    streams before returning). Tensors not on the communicator's device are copied there first."""
    from vllm.distributed.weight_transfer import packed_tensor

    device = comm.device
    packed_tensor.packed_nccl_broadcast_producer(
        iterator=iter(named), group=comm, src=0, post_iter_func=lambda item: item[1].to(device),
        buffer_size_bytes=buffer_bytes, num_buffers=num_buffers)


def broadcast_patches(comm: Communicator, patches: Iterable[Patch], ready=None, ops: CudaOps = CUDA) -> None:
    """Delta push: per patch, its indices then its values, from rank 0 (the order vLLM's sparse
    engine receives them in). On CUDA every copy to the device and every broadcast runs on the
    dedicated "send" stream (``weightsync.staging``), which first waits for the staging event
    ``ready``; then only that stream is synchronised. Never the default stream: rank 0 trains on it
    meanwhile, and NCCL kernels queued there would stall the training until every engine joined.
    Each device copy is dropped as soon as its broadcast is queued: it was allocated on the send
    stream, so the caching allocator hands its memory only to a later allocation on that stream,
    which runs after the broadcast. (Keeping them all would hold the whole delta, up to the size of
    the dense push, on rank 0's GPU through the next training step.)"""
    device = comm.device
    stream = send_stream(device, ops)
    if stream is not None and ready is not None:
        ops.wait_event(stream, ready)
    with using(stream, ops):
        for p in patches:
            for t in (p.indices, p.values):
                comm.broadcast(t.to(device) if stream is None else ops.to_device(t, device), src=0,
                               stream=stream)
    if stream is not None:
        ops.synchronize(stream)


class NcclPlane:
    """The ``SenderPlane`` for NCCL (rank 0 of a group of ``1 + num_receivers * tp`` ranks).

    One generation = ``init_info(r)`` for every receiver (all get the same unique id, minted at the
    first call), then ``connect``, which consumes the id: the next ``init_info`` mints a new one, and
    the next ``connect`` destroys the previous communicator. ``abort`` drops both.

    ``packed_buffer_bytes``/``num_buffers``: geometry of vLLM's packed broadcast (sent to the engines
    in ``init_info``). ``control``: the control-plane fields of ``nccl_engine.ImpalaNcclInitInfo``
    (``host``, ``port``, ``prefix``, ``timeout_s``, ``connect_timeout_s``, optionally ``name``), copied
    into every ``init_info`` together with the receiver's ``rank``, since the control plane publishes
    ``init_info`` unchanged (``weightsync.plane``). ``store``: the group's control-plane store, read to
    cancel a push that a receiver nacked or left (``push_outcome.push_failure_probe``; None: only the
    deadline and ``abort`` end a push). ``communicator_factory`` (tests) replaces vLLM's rendezvous,
    ``mint_uid`` replaces ``ncclGetUniqueId``. Untested on real GPUs here."""

    backend = "nccl"
    engine_backend = NCCL_ENGINE_BACKEND
    patch_cost = staticmethod(int32_patch_nbytes)  # vLLM's sparse format: the delta's dense fallback

    def __init__(self, num_receivers: int, tp: int = 1,
                 packed_buffer_bytes: int = DEFAULT_PACKED_BUFFER_BYTES, num_buffers: int = DEFAULT_NUM_BUFFERS,
                 *, control: dict | None = None, communicator_factory: CommunicatorFactory | None = None,
                 mint_uid: Callable[[], bytes] = mint_unique_id, min_gbps: float = DEFAULT_MIN_GBPS,
                 ops: CudaOps = CUDA, store: dist.Store | None = None):
        self.world_size = group_world_size(num_receivers, tp)
        if packed_buffer_bytes < 1 or num_buffers < 1:
            raise ValueError(f"need packed_buffer_bytes >= 1 and num_buffers >= 1, got {packed_buffer_bytes} "
                             f"and {num_buffers}")
        self.num_receivers, self.tp = num_receivers, tp
        self.packed_buffer_bytes, self.num_buffers = int(packed_buffer_bytes), int(num_buffers)
        self.control = dict(control or {})
        self._factory = communicator_factory
        self._mint = mint_uid
        self._uid: bytes | None = None  # minted for the generation being set up, consumed by connect
        self._comm: GatedCommunicator | None = None
        self._aborts = 0  # calls of ``abort``: a rendezvous in flight watches it
        self.store = store
        if min_gbps <= 0:
            raise ValueError(f"weight_sync.min_gbps must be > 0, got {min_gbps}")
        self.min_gbps, self._ops = float(min_gbps), ops

    @classmethod
    def for_sender(cls, ctx: PlaneContext) -> NcclPlane:
        return cls(ctx.num_receivers, ctx.tp, packed_buffer_bytes=ctx.bucket_bytes, control={
            "host": ctx.host, "port": ctx.port, "prefix": ctx.prefix, "timeout_s": ctx.timeout_s,
            "connect_timeout_s": ctx.connect_timeout_s}, min_gbps=ctx.min_gbps, store=ctx.store)

    def init_info(self, rank: int) -> dict:
        if self._uid is None:
            self._uid = self._mint()
        return {**self.control, "rank": rank,
                **nccl_init_info(rank, self.num_receivers, self.tp, self._uid, self.packed_buffer_bytes,
                                 self.num_buffers)}

    def connect(self, timeout_s: float) -> None:
        """Join the group as rank 0 while every receiver joins inside its engine's init. A no-op when
        connected and no new generation was set up."""
        if self._uid is None:
            if self._comm is not None:
                return
            raise RuntimeError("NcclPlane.connect before init_info: no receiver knows the NCCL unique id")
        uid, self._uid = self._uid, None
        self.abort()
        aborts = self._aborts
        factory = self._factory or partial(vllm_communicator, device=torch.accelerator.current_device_index())
        comm = call_with_deadline(  # joined, then the broadcast ring built (comm.build_ring)
            lambda: build_ring(factory(uid, 0, self.world_size)), timeout_s,
            f"NCCL rendezvous of the learner with {self.num_receivers} engine(s) x {self.tp} rank(s)",
            cancelled=lambda: "was cancelled: the plane was aborted" if self._aborts != aborts else None,
            on_late=lambda comm: comm.destroy())
        self._comm = GatedCommunicator(comm)

    def update_info(self, payload: Payload) -> dict:
        """``nccl_update_info`` plus the push's ``deadline_s`` (``plane.push_deadline_s``), which the
        receivers watch it for (and a grace) instead of their init's ``timeout_s``."""
        nbytes = send_stats(payload, self.packed_buffer_bytes)["bytes"]
        return {**nccl_update_info(payload), "deadline_s": push_deadline_s(
            float(self.control.get("timeout_s", 60.0)), nbytes, self.min_gbps)}

    def send(self, payload: Payload, timeout_s: float) -> dict:
        comm = self._comm
        if comm is None:
            raise WeightSyncError("NCCL plane not connected (or aborted by an earlier failure): re-init it")
        stats = send_stats(payload, self.packed_buffer_bytes)
        deadline_s = push_deadline_s(timeout_s, stats["bytes"], self.min_gbps)

        def transmit() -> None:
            with on_device(comm.device):
                if payload.full is not None:  # vLLM's producer reads the host copies on its own streams
                    payload.wait_ready()
                    broadcast_full(comm, payload.full, self.packed_buffer_bytes, self.num_buffers)
                else:
                    broadcast_patches(comm, payload.patches, payload.ready, self._ops)

        failed = None if self.store is None else push_failure_probe(
            self.store, list(range(1, self.num_receivers + 1)), payload.seq, joins=self.tp)

        def cancelled() -> str | None:
            if self._comm is not comm:
                return "was aborted"
            return None if failed is None else failed()

        try:
            call_with_deadline(transmit, deadline_s,
                               f"NCCL broadcast of version {payload.version} (push #{payload.seq})",
                               cancelled=cancelled)
        except WeightSyncError as e:
            self.abort()
            raise WeightSyncError(f"{e}; NCCL communicator aborted",
                                  failed_ranks=getattr(failed, "blamed", None)) from e
        return stats

    def abort(self) -> None:
        """Drop the communicator (``ncclCommAbort``) and the generation being set up; a ``connect`` still in
        its rendezvous on another thread ends at once (the driver rebuilds the group: rank 0's old join must
        not hold its second thread for ``connect_timeout_s``)."""
        self._aborts += 1
        self._uid = None
        comm, self._comm = self._comm, None
        if comm is not None:
            with contextlib.suppress(Exception):
                comm.destroy()
