"""A CPU actor's vLLM engine-core process is forked from the actor, not spawned.

Why: an `AsyncLLM` runs its engine core in a process of its own, and inside a Ray actor vLLM always
starts that process with ``spawn`` (`vllm.utils.system_utils._maybe_force_spawn`: "In a Ray actor and
can only be spawned"). The new interpreter then imports torch, transformers and vLLM again, which the
actor has just done: ``from vllm.v1.engine.core import EngineCoreProc`` alone is 15.9 CPU-seconds on
this project's 2-core test machine. A forked engine core inherits the actor's imports. Measured on the
quick-start (2 actors, a 2-core machine): each engine-core process's CPU to the first training step
22 -> 12 CPU-s; the engines up after the command, forked / spawned, median 0.81 over five alternated
pairs (0.74-0.95, e.g. 39.3 vs 51.5 s; bench/e2e/startup.py, bench/RESULTS.md "Start-up").

Why a fork is sound here:
  - vLLM forks its engine core itself outside Ray (``VLLM_WORKER_MULTIPROC_METHOD`` defaults to
    ``fork``), from threaded front ends too (a ``--serial`` run's driver), so the engine core's own
    state survives a fork. What a Ray worker adds is its threads and sockets; the child uses neither
    (it never calls Ray, and multiprocessing ends a forked child with ``os._exit``, so no exit hook of
    Ray's runs there).
  - The sockets must go, though: Ray learns that a worker died when the worker's connection to its
    raylet closes, and a child holding a copy keeps it open. With them kept, a SIGKILLed actor was seen
    only by the driver's 30 s health-check deadline instead of at once as dead. The child therefore
    points every inherited socket at /dev/null before vLLM's code runs (the engine core opens its own
    ZMQ sockets after that; the rest of what it inherits, pipes included, it keeps). When the actor
    dies, Ray kills the worker's process group, engine core included (`launch.processes.process_graph`; the
    actor-restart end-to-end test kills an actor and checks both).
  - The actor has run no torch operator before the fork (it has imported modules and loaded the
    tokenizer), so no OpenMP thread pool exists to be lost in the child.
  - GPU engines are never forked (a CUDA context does not survive a fork): there vLLM spawns, as before.

The process title: Ray moves a worker's argv to write its own titles ("ray::ActorRole.start"), after which
the ``setproctitle`` package vLLM names its processes with changes nothing in any Ray worker; the child
therefore takes vLLM's title through Ray's own call (``VLLM::EngineCore``, as a spawned engine core shows
in ``ps``).

The way back: ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in the environment keeps vLLM's spawn (for a platform
whose OpenMP or a vLLM release that does not survive the fork). Deviation from vLLM: while an engine starts,
`vllm.v1.engine.utils.get_mp_context` (vLLM 0.32, the release `launch.planning.versions` checks) answers with the
fork context below.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing.context import ForkProcess


def drop_inherited_sockets() -> None:
    """Point every socket descriptor this process holds at /dev/null. Called first thing
    in a forked child, where every socket is the parent's (module docstring). The numbers stay taken, so a
    stale object that closes "its" descriptor later cannot close a socket the child has opened since."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                is_socket = fd != null and os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:  # the listing's own descriptor, closed by now
                continue
            if is_socket:
                os.dup2(null, fd)
    finally:
        os.close(null)


class TitledFork(ForkProcess):
    """A forked process that lets go of its parent's sockets (`drop_inherited_sockets`) and takes the title
    ``VLLM::<its name>`` (vLLM names its engine core "EngineCore") through Ray's title call when Ray is
    loaded, else the ``setproctitle`` package."""

    def run(self) -> None:
        drop_inherited_sockets()
        title = f"VLLM::{self.name}"
        try:
            from ray._raylet import setproctitle
        except ImportError:
            from setproctitle import setproctitle
        setproctitle(title)
        super().run()


class ForkContext:
    """multiprocessing's fork context whose processes are `TitledFork`s: what vLLM gets while it starts an
    engine core in a Ray actor (module docstring)."""

    Process = TitledFork

    def __getattr__(self, name: str):
        return getattr(multiprocessing.get_context("fork"), name)


def forks_engine_core(cpu: bool) -> bool:
    """Whether an engine started here forks its engine core: a CPU engine, in a Ray actor (where vLLM
    would spawn it), unless ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` asks for vLLM's way."""
    if not cpu or os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn" or "ray" not in sys.modules:
        return False
    import ray  # what vllm.ray.lazy_utils.is_in_ray_actor asks

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


@contextlib.contextmanager
def engine_core_forked(cpu: bool) -> Iterator[None]:
    """Within this block an `AsyncLLM` started here forks its engine core (`forks_engine_core`)."""
    if not forks_engine_core(cpu):
        yield
        return
    import vllm.v1.engine.utils as engine_utils

    spawning = engine_utils.get_mp_context
    engine_utils.get_mp_context = ForkContext
    try:
        yield
    finally:
        engine_utils.get_mp_context = spawning
