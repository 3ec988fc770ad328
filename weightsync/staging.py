"""Where a prepared push waits on learner rank 0, and the CUDA streams that move it (torch only).

Why: ``WeightSender.prepare`` gathers the weights between two training steps and ``send`` transmits
them while the next step trains. Kept on the GPU, a 7B bf16 payload (15.2 GB, and as much again for
the delta baseline) would sit beside that step's activations. So ``prepare`` stages every tensor it
keeps (the payload, the patches, the next delta baseline) in pinned host memory with a non-blocking
device -> host copy on a side stream (``HostStager``), and the data plane copies each back to its
device only while sending it. Tensors already on the CPU are kept as they are: nothing changes for
CPU runs.

Stream rules (CUDA):
- Staging: the "stage" stream waits for the caller's current stream (which produced the tensor)
  before each copy, and the source tensor is ``record_stream``-ed on it, so the caching allocator
  does not hand its memory out again before the copy has read it. ``HostStager.done`` records an
  event after the last copy: ``Payload.ready``. Whoever reads the host tensors waits for that event
  (``Payload.wait_ready``: the staging copies only, never the whole device or the training stream).
- Sending (``weightsync.nccl.plane``): a delta's patches are copied and broadcast on a "send" stream
  that waits for ``Payload.ready`` (an event wait, not a synchronisation of the default stream, on
  which rank 0 keeps training), then only that stream is synchronised. A new thread's current stream
  is the legacy default stream: NCCL kernels queued there would wait for (and delay) training.

Memory: one sender allocates the host memory of its pushes once and reuses it (``StagingArea``):
- one buffer per tensor of the dense push (``HostMemory.slot``), overwritten in place by the next
  push. So the delta baseline costs nothing more: a push's tensors are the next push's baseline, and
  tensor i's diff reads its old bytes before its new ones are copied over them (the copy waits for
  the stream the diff ran on; on the CPU the diff has finished before);
- one flat arena for a delta's patches, as large as the dense push (a delta is sent only while it is
  smaller, ``weightsync.delta``), carved into views from its start at every push.
The buffers are ordinary allocations whose pages are registered with ``cudaHostRegister``
(``CudaOps.host_buffer``), not torch's pinned allocator: that one rounds every block up to a power of
two and keeps it cached for the life of the process (``CachingHostAllocator.h``), so a 7B bf16
payload of 15.2 GB took 29 GB of pinned memory, about 58 GB in delta mode (a second set of blocks
for the next baseline), all allocated on the first pushes' critical path. Now 15.2 GB, 30.5 GB in
delta mode (``pinned_staging_bytes``), allocated ahead of the first push (``StagingArea.reserve``,
from the model's parameter shapes: page-locking 15-30 GB takes seconds, which the first push would
spend between two training steps) and then reused, by the next sender too (``handed_over``: a weight-sync
group rebuilt after an actor restart). A buffer is reused only after the push that filled it was
sent: a payload prepared before the previous one was sent, or after a failed send (whose abandoned
thread may still read it), gets new buffers.

Every CUDA call goes through ``CudaOps`` so that the tests can check the choreography and the memory
on a machine without CUDA (a fake ops object recording the calls). NOT yet run on a GPU here.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from functools import cache

import torch

PAGE = 4096  # cudaHostRegister locks whole pages
HOST_BUFFER_OVERHEAD = 2 * PAGE  # a buffer's pages are aligned inside an allocation this much larger
ALIGN = 64  # every view carved from the patch arena starts at a multiple of this: aligned for any dtype


@cache
def _side_stream(device_index: int, role: str):
    # cached: the caching allocator keys blocks by stream, so a fresh stream per push would strand
    # reserved memory (the reason vLLM caches its packed-broadcast streams too)
    return torch.cuda.Stream(device=device_index)


class CudaOps:
    """The CUDA calls of the sender's data path."""

    def side_stream(self, device: torch.device, role: str):
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _side_stream(index, role)

    def current_stream(self, device: torch.device):
        return torch.cuda.current_stream(device)

    def wait_stream(self, stream, other) -> None:
        stream.wait_stream(other)

    def wait_event(self, stream, event) -> None:
        stream.wait_event(event)

    def use(self, stream):
        return torch.cuda.stream(stream)

    def on_host(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is kept as it is (already in host memory) rather than staged."""
        return t.device.type == "cpu"

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` (> 0) of page-locked host memory, exactly, as a uint8 tensor: an ordinary CPU
        allocation of ``HOST_BUFFER_OVERHEAD`` more, whose page-aligned middle is registered with
        ``cudaHostRegister`` (whole pages of its own, so no two buffers share a registered page) and
        unregistered when the storage is freed (as torch's own checkpoint stager does)."""
        raw = torch.empty(nbytes + HOST_BUFFER_OVERHEAD, dtype=torch.uint8)
        start = -raw.data_ptr() % PAGE
        ptr = raw.data_ptr() + start
        cudart = torch.cuda.cudart()
        err = int(cudart.cudaHostRegister(ptr, -(-nbytes // PAGE) * PAGE, 0))
        if err:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes of host memory failed: cudaError {err}")
        weakref.finalize(raw.untyped_storage(), cudart.cudaHostUnregister, ptr).atexit = False
        return raw[start:start + nbytes]

    def copy_to_host(self, t: torch.Tensor, out: torch.Tensor, stream) -> None:
        """Copy ``t`` into the host tensor ``out`` on ``stream`` (the current one), not waited for."""
        out.copy_(t, non_blocking=True)
        t.record_stream(stream)

    def to_device(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``t`` on ``device``, copied on the current stream (asynchronously from pinned memory)."""
        return t.to(device, non_blocking=True)

    def record_event(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def synchronize(self, stream) -> None:
        stream.synchronize()


CUDA = CudaOps()


def pinned_staging_bytes(payload_bytes: int, mode: str, *, tensors: int = 0) -> int:
    """Host memory (bytes) that staging takes on learner rank 0 for a dense push of ``payload_bytes``
    in ``tensors`` tensors, page-locked but for a few KiB per buffer (module docstring): in mode
    "full" one buffer per tensor; in mode "delta" also the patch arena (the payload's bytes, plus
    ``ALIGN`` per index and value view). Each buffer costs ``HOST_BUFFER_OVERHEAD`` more: 8 KiB, so
    2.8 MB for the 339 tensors of a 7B model (``tensors`` 0 leaves that out)."""
    if mode not in ("full", "delta"):
        raise ValueError(f"weight_sync.mode must be 'full' or 'delta', got {mode!r}")
    slots = payload_bytes + tensors * HOST_BUFFER_OVERHEAD
    if mode == "full":
        return slots
    return slots + payload_bytes + 2 * ALIGN * tensors + HOST_BUFFER_OVERHEAD


class HostMemory:
    """The host buffers pushes are staged in (module docstring): ``slots``, one per tensor name, and
    ``arena`` for a delta's patches. ``allocated``: bytes allocated so far, ``HOST_BUFFER_OVERHEAD``
    included (what ``pinned_staging_bytes`` estimates)."""

    def __init__(self, ops: CudaOps = CUDA):
        self.ops = ops
        self.slots: dict[str, torch.Tensor] = {}
        self.arena: torch.Tensor | None = None
        self.allocated = 0

    def _buffer(self, nbytes: int) -> torch.Tensor:
        self.allocated += nbytes + HOST_BUFFER_OVERHEAD
        return self.ops.host_buffer(nbytes)

    def slot(self, name: str, nbytes: int) -> torch.Tensor:
        """The buffer of tensor ``name``: the last push's when it has ``nbytes``, else a new one."""
        buf = self.slots.get(name)
        if buf is None or buf.numel() != nbytes:
            buf = self.slots[name] = self._buffer(nbytes)
        return buf

    def patch_arena(self, nbytes: int) -> torch.Tensor:
        """The patch arena, (re)allocated when smaller than ``nbytes``."""
        if self.arena is None or self.arena.numel() < nbytes:
            self.arena = self._buffer(nbytes)
        return self.arena


class HostStager:
    """Stages one push in ``memory`` (module docstring): ``weight(name, t)`` a tensor of the dense
    push (the next baseline), ``patch(t)`` a delta's indices or values. Each returns ``t`` itself when
    it is in host memory already (CPU runs: nothing changes), else its host copy, whose bytes are
    valid once the event from ``done()`` has completed. ``patch`` returns None when the arena is full:
    the patches would outgrow the dense push, which is then sent instead."""

    def __init__(self, memory: HostMemory):
        self.memory, self.ops = memory, memory.ops
        self._stream = None
        self._arena_bytes = 0  # the patch arena this push needs (``expect_delta``)
        self._carved = 0  # bytes of it used so far
        self._names: set[str] = set()

    def expect_delta(self, dense_bytes: int, tensors: int) -> None:
        """The patches of this push may take up to ``dense_bytes`` (the dense push's size: beyond it
        the push is sent dense), plus an ``ALIGN`` per view (indices and values of each tensor). The
        arena is allocated at the first patch of a tensor to stage (never for CPU runs)."""
        self._arena_bytes = dense_bytes + 2 * ALIGN * tensors

    def weight(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self.ops.on_host(t):
            return t
        self._names.add(name)
        if not t.numel():
            return torch.empty(t.shape, dtype=t.dtype)
        return self._copy(t, self.memory.slot(name, t.numel() * t.element_size()))

    def patch(self, t: torch.Tensor) -> torch.Tensor | None:
        if self.ops.on_host(t):
            return t
        arena = self.memory.patch_arena(self._arena_bytes)
        start = -(-self._carved // ALIGN) * ALIGN
        end = start + t.numel() * t.element_size()
        if end > arena.numel():
            return None
        self._carved = end
        return self._copy(t, arena[start:end])

    def _copy(self, t: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        out = buf.view(t.dtype).view(t.shape)
        ops = self.ops
        if self._stream is None:
            self._stream = ops.side_stream(t.device, "stage")
        ops.wait_stream(self._stream, ops.current_stream(t.device))
        with ops.use(self._stream):
            ops.copy_to_host(t, out, self._stream)
        return out

    def done(self):
        """The event that completes once every copy issued so far has landed (None: nothing staged).
        Frees the slots of names this push did not have."""
        for name in set(self.memory.slots) - self._names:
            del self.memory.slots[name]
        return None if self._stream is None else self.ops.record_event(self._stream)


class StagingArea:
    """One sender's staging memory, reused from push to push: ``stager(seq)`` stages push ``seq`` in
    the buffers of the previous push once that one was ``release``d (sent), else in new buffers (the
    old ones stay with whoever may still read them: an unsent payload, a failed send's thread)."""

    def __init__(self, ops: CudaOps = CUDA):
        self.ops = ops
        self.memory = HostMemory(ops)
        self._holder: int | None = None  # the push whose bytes are in ``memory``, until it was sent
        self._lock = threading.Lock()  # release runs on the send thread

    def stager(self, seq: int) -> HostStager:
        with self._lock:
            if self._holder is not None:
                self.memory = HostMemory(self.ops)
            self._holder = seq
            return HostStager(self.memory)

    def release(self, seq: int) -> None:
        """Push ``seq`` was sent: nothing reads its buffers any more."""
        with self._lock:
            if self._holder == seq:
                self._holder = None

    def reserve(self, sizes: list[tuple[str, int]], delta: bool) -> int:
        """Allocate now what a push of tensors of ``sizes`` ((name, bytes) each) will be staged in: a
        buffer per tensor and, with ``delta``, the patch arena as ``HostStager.expect_delta`` sizes it, so
        the first push only copies. Returns the bytes allocated so far (``pinned_staging_bytes``)."""
        with self._lock:
            if self._holder is not None:  # a push's bytes are here: the next one gets new buffers anyway
                return self.memory.allocated
            for name, nbytes in sizes:
                if nbytes:  # an empty tensor is never staged (``HostStager.weight``)
                    self.memory.slot(name, nbytes)
            if delta and sizes:
                self.memory.patch_arena(sum(n for _, n in sizes) + 2 * ALIGN * len(sizes))
            return self.memory.allocated

    def handed_over(self) -> StagingArea:
        """The area of the sender that replaces this one's: this memory when every push staged in it was
        sent, else new (an unsent or failed push may still be read). A new object, so that a release
        by this sender's send thread can never free a push of the next sender's."""
        with self._lock:
            area = StagingArea(self.ops)
            if self._holder is None:
                area.memory = self.memory
            self._holder = -1  # this area stages nothing more: its memory is the next sender's
            return area


def wait_ready(ready) -> None:
    """Block the calling thread until the staging event ``ready`` (None: nothing to wait for) is done."""
    if ready is not None:
        ready.synchronize()


def send_stream(device: torch.device, ops: CudaOps = CUDA):
    """The stream a delta push is broadcast on (None for a CPU device: test fakes)."""
    return None if device.type == "cpu" else ops.side_stream(device, "send")


def using(stream, ops: CudaOps = CUDA):
    return contextlib.nullcontext() if stream is None else ops.use(stream)
