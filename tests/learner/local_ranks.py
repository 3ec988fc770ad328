"""Starting N learner ranks as local processes (torch.multiprocessing, spawn), without Ray: for tests
and benchmarks (a run starts its ranks as Ray actors, `launch.processes.roles.LearnerRank`).

- `spawn_ranks(fn, world_size, *args)`: run `fn(rank, world_size, *args)` in N fresh processes that
  share a process group (MASTER_ADDR/PORT set: loopback, these are processes of this machine), collect the return values; if one rank fails, the
  others are killed and the first error is raised here with its traceback.
- `LearnerGroup`: N long-lived ranks, each holding a `Learner`, driven from this process:
  `step(groups, version)`, `save(path, extra_state)`, `load(path)`, and `call(fn, *args)` to run any
  top-level function `fn(learner, *args)` on every rank (e.g. to push weights from rank 0 with the
  weight-sync sender). Arguments travel over multiprocessing pipes, local to one machine.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import torch.multiprocessing as mp

from learner.distributed import LOOPBACK, free_port


def _env(rank: int, world_size: int, port: int) -> None:
    os.environ.update({"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank)})
    import torch

    if not torch.cuda.is_available():  # CPU ranks share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))


def _run_rank(fn: Callable, rank: int, world_size: int, port: int, args: tuple, queue) -> None:
    _env(rank, world_size, port)
    try:
        queue.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # report every failure, including KeyboardInterrupt/SystemExit
        queue.put((rank, False, traceback.format_exc()))
    finally:
        _destroy_group()


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def spawn_ranks(fn: Callable, world_size: int, *args: Any, timeout_s: float = 600.0) -> list[Any]:
    """Results of fn(rank, world_size, *args) for every rank, in rank order (fn: a top-level function)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_run_rank, args=(fn, r, world_size, port, args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout_s)
            if not ok:
                raise RuntimeError(f"learner rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10.0 if len(results) == world_size else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world_size)]


def _serve(rank: int, world_size: int, port: int, cfg, model_dir: str, kwargs: dict, conn) -> None:
    _env(rank, world_size, port)
    try:
        from learner.learner import Learner

        learner = Learner(cfg, rank, world_size, model_dir, **kwargs)
        conn.send((True, None))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            fn, args = msg
            try:
                conn.send((True, fn(learner, *args)))
            except Exception:
                conn.send((False, traceback.format_exc()))
    except Exception:
        conn.send((False, traceback.format_exc()))
    finally:
        _destroy_group()
        conn.close()


def _step(learner, groups, version):
    return learner.step(groups, version)


def _save(learner, path, extra_state):
    return str(learner.save(path, extra_state))


def _load(learner, path):
    return learner.load(path)


class LearnerGroup:
    """N learner ranks in child processes; every method runs on all ranks and returns rank 0's result."""

    def __init__(self, cfg, world_size: int, model_dir: str, *, timeout_s: float = 600.0, **learner_kwargs: Any):
        ctx = mp.get_context("spawn")
        port = free_port()
        self.timeout_s = timeout_s
        self.conns, self.procs = [], []
        for r in range(world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(r, world_size, port, cfg, str(model_dir), learner_kwargs, child),
                            daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        try:
            self._collect("start")
        except BaseException:
            self.close()
            raise

    def _collect(self, what: str) -> list[Any]:
        """Every rank's answer; the first failure (or a dead rank) raises at once, since the ranks still
        running would wait forever in a collective with the failed one: close() the group after that."""
        out: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(out) < len(self.conns):
            pending = [c for r, c in enumerate(self.conns) if r not in out]
            ready = wait(pending, timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            for conn in ready:
                r = self.conns.index(conn)
                try:
                    ok, value = conn.recv()
                except EOFError:
                    raise RuntimeError(f"learner rank {r} died during {what}") from None
                if not ok:
                    raise RuntimeError(f"learner rank {r} failed in {what}:\n{value}")
                out[r] = value
            dead = [r for r, p in enumerate(self.procs) if r not in out and not p.is_alive()
                    and not self.conns[r].poll()]
            if dead:
                raise RuntimeError(f"learner rank(s) {dead} exited during {what}")
            if time.monotonic() > deadline and len(out) < len(self.conns):
                raise TimeoutError(f"learner ranks {sorted(set(range(len(self.conns))) - set(out))} did not "
                                   f"answer {what} within {self.timeout_s:.0f} s")
        return [out[r] for r in range(len(self.conns))]

    def call(self, fn: Callable, *args: Any) -> list[Any]:
        """fn(learner, *args) on every rank (fn: a top-level function); results in rank order."""
        for conn in self.conns:
            conn.send((fn, args))
        return self._collect(getattr(fn, "__name__", "call"))

    def step(self, groups, version: int) -> dict[str, float]:
        return self.call(_step, groups, version)[0]

    def save(self, path, extra_state: dict | None = None) -> str:
        return self.call(_save, str(path), extra_state)[0]

    def load(self, path) -> dict:
        return self.call(_load, str(path))[0]

    def close(self) -> None:
        """Stop every rank (politely, then by force); safe to call twice."""
        for conn in self.conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(None)
        for p in self.procs:
            p.join(timeout=10.0)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
