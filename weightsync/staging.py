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

Every CUDA call goes through ``CudaOps`` so that the tests can check the choreography on a machine
without CUDA (a fake ops object recording the calls). NOT yet run on a GPU here.
"""

from __future__ import annotations

import contextlib
from functools import cache

import torch


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

    def copy_to_host(self, t: torch.Tensor, stream) -> torch.Tensor:
        """A pinned host copy of ``t``, issued on ``stream`` (the current one), not waited for."""
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        t.record_stream(stream)
        return host

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


class HostStager:
    """``stager(t)``: ``t`` itself when on the CPU, else a pinned host copy of it whose bytes are valid
    once the event from ``done()`` has completed (module docstring). One stager per push."""

    def __init__(self, ops: CudaOps = CUDA):
        self.ops = ops
        self._stream = None

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu":
            return t
        ops = self.ops
        if self._stream is None:
            self._stream = ops.side_stream(t.device, "stage")
        ops.wait_stream(self._stream, ops.current_stream(t.device))
        with ops.use(self._stream):
            return ops.copy_to_host(t, self._stream)

    def done(self):
        """The event that completes once every copy issued so far has landed (None: nothing staged)."""
        return None if self._stream is None else self.ops.record_event(self._stream)


def wait_ready(ready) -> None:
    """Block the calling thread until the staging event ``ready`` (None: nothing to wait for) is done."""
    if ready is not None:
        ready.synchronize()


def send_stream(device: torch.device, ops: CudaOps = CUDA):
    """The stream a delta push is broadcast on (None for a CPU device: test fakes)."""
    return None if device.type == "cpu" else ops.side_stream(device, "send")


def using(stream, ops: CudaOps = CUDA):
    return contextlib.nullcontext() if stream is None else ops.use(stream)
