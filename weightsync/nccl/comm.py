"""The NCCL communicator as both ends of ``weightsync.nccl`` use it: what we need of vLLM's
``PyNcclCommunicator``, the gate closed before it is destroyed, and the deadline every blocking NCCL
call runs under.

Deadlines: every blocking NCCL call (a rendezvous, a push) runs on a daemon thread while the caller
waits with its deadline (``call_with_deadline``). On expiry or a cancel the caller destroys the
communicator (vLLM's ``destroy``: ``ncclCommAbort``, which ends the stuck kernels) and raises
``WeightSyncError``; the thread is abandoned, never joined, so a stalled peer never blocks the caller.

Nothing here imports vllm at module level (the learner may run without it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

from weightsync.protocol import WeightSyncError

POLL_S = 0.05  # how often a deadline wait looks at its cancel probe
_abandoned = [0]  # calls abandoned by `call_with_deadline` whose thread has not returned yet (under _count_lock)
_count_lock = threading.Lock()


def abandoned_calls() -> int:
    """Threads of this process that `call_with_deadline` abandoned and that are still blocked in their call (a
    rendezvous that never formed stays in ``ncclCommInitRank``, which NCCL offers no way to end; each failed
    generation also leaves NCCL's bootstrap-root thread of its unique id on learner rank 0). Harmless unless
    rebuilds fail in a loop: every deadline or cancel error states the count (review gpu_path_3 F11)."""
    return _abandoned[0]

T = TypeVar("T")


class Communicator(Protocol):
    """What we use of vLLM's ``PyNcclCommunicator`` (and what a test fake must provide)."""

    device: torch.device

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None: ...

    def destroy(self) -> None: ...


# A communicator factory: (unique id bytes, rank, world size) -> joined communicator.
CommunicatorFactory = Callable[[bytes, int, int], Communicator]


class GatedCommunicator:
    """``comm`` behind a gate that ``destroy`` closes before it destroys ``comm``: a broadcast after
    that raises ``WeightSyncError`` instead of reaching NCCL. Every other attribute is ``comm``'s.

    Why: a push is abandoned by destroying its communicator from another thread (a deadline, a cancel,
    the sender's abort key), while the thread in the push (vLLM's packed producer on the learner, the
    worker's consumer) stays blocked in it. When ``ncclCommAbort`` ends its kernels that thread wakes
    and, within milliseconds, issues the next broadcast on a communicator being torn down or freed
    (undefined in NCCL: an error, or a crash of learner rank 0 or the worker); a producer would also
    go on copying every remaining bucket to the GPU. vLLM's own flag does not help: its ``broadcast``
    returns early once ``disabled`` is set, but ``destroy`` sets it only after the abort (and a join
    of up to 5 s), and does nothing at all when it is already set (``pynccl.py``: ``if self.available
    and not self.disabled``), so setting it first would skip the abort and leave the kernels stuck.
    The gate closes first, then vLLM aborts; the woken thread raises at its next broadcast and its
    loop ends. (A broadcast already past the gate when the abort starts is in flight: the case
    ``ncclCommAbort`` exists to end.)"""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.closed = False

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        if self.closed:
            raise WeightSyncError("NCCL communicator destroyed: broadcast refused")
        self.comm.broadcast(tensor, src=src, stream=stream)

    def destroy(self) -> None:
        self.closed = True
        self.comm.destroy()

    def __getattr__(self, name: str):
        return getattr(self.comm, name)


def on_device(device: torch.device | None):
    """Make ``device`` current in this thread (a new thread starts on CUDA device 0, and vLLM's
    helpers read the current device); a no-op for CPU, i.e. for test fakes."""
    if device is None or device.type == "cpu":
        return contextlib.nullcontext()
    return torch.accelerator.device_index(device.index)


def build_ring(comm: Communicator) -> Communicator:
    """One 1-element broadcast from rank 0 on a communicator just joined (every rank of the group calls it, right
    after its join), waited for; returns ``comm`` (destroyed, and the error raised, when it fails).

    Why (review gpu_path_3 F6): NCCL since 2.22 connects lazily (``NCCL_RUNTIME_CONNECT``), and vLLM's warm-up
    after the join is a 1-element all_reduce, for which NCCL picks tree/LL algorithms: the ring channels that
    broadcast uses (IB queue pairs, P2P buffers) would be set up inside the first push's broadcast, a blocking
    host call past the ``GatedCommunicator`` gate, where an abort is undefined and a transport fault names no
    receiver. A broadcast here builds them while every rank is known to be in the rendezvous, under its
    deadline, so a data-port problem fails the join (``WeightSyncUnformed``, naming the node) instead."""
    try:
        with on_device(comm.device):
            comm.broadcast(torch.zeros(1, device=comm.device), src=0)
            if comm.device.type == "cuda":
                torch.accelerator.synchronize(comm.device.index)
    except BaseException:
        with contextlib.suppress(Exception):
            comm.destroy()
        raise
    return comm


def call_with_deadline(fn: Callable[[], T], timeout_s: float, what: str, *,
                       cancelled: Callable[[], str | None] | None = None,
                       on_late: Callable[[T], None] | None = None) -> T:
    """Run ``fn`` on a daemon thread and return its result, waiting at most ``timeout_s``.

    Raises ``WeightSyncError`` when the deadline passes first, when ``cancelled`` (polled every
    ``POLL_S``, and once more after ``fn`` returned) gives a reason, or (chained) when ``fn`` raises.
    A thread overtaken by the deadline or a cancel is abandoned, never joined; if ``fn`` completes
    later anyway, its result goes to ``on_late`` (e.g. destroy a communicator nobody will use)."""
    lock = threading.Lock()
    done = threading.Event()
    box: dict = {"abandoned": False}

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the caller
            result, error = None, e
        with lock:
            box["result"], box["error"] = result, error
            late = box["abandoned"]
            done.set()
        if late:
            with _count_lock:
                _abandoned[0] -= 1
        if late and error is None and on_late is not None:
            with contextlib.suppress(Exception):
                on_late(result)

    threading.Thread(target=run, name=f"weightsync-nccl: {what}", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(max(0.0, min(POLL_S, deadline - time.monotonic()))):
        why = cancelled() if cancelled is not None else None
        if why is None and time.monotonic() >= deadline:
            why = f"did not finish within its {timeout_s:.1f} s deadline"
        if why is not None:
            with lock:
                if not done.is_set():
                    box["abandoned"] = True
                    with _count_lock:
                        _abandoned[0] += 1
                    raise WeightSyncError(f"{what} {why} ({abandoned_calls()} abandoned NCCL call(s) still "
                                          "blocked in this process)")
    why = cancelled() if cancelled is not None else None
    if why is not None:  # cancelled while finishing: what it produced is not trusted
        raise WeightSyncError(f"{what} {why}") from box["error"]
    if box["error"] is not None:
        raise WeightSyncError(f"{what} failed: {box['error']!r}") from box["error"]
    return box["result"]


def vllm_communicator(unique_id: bytes, rank: int, world_size: int, *, device: int) -> Communicator:
    """vLLM's unique-id rendezvous (no store, no pickle; every rank must enter concurrently)."""
    from vllm.distributed.weight_transfer.nccl_common import uid_init_process_group

    return uid_init_process_group(unique_id, rank, world_size, device)
