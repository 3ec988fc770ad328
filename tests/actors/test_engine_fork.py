"""`actors.engine_fork` in a real Ray actor: a CPU engine's core is forked there (GPU engines and
VLLM_WORKER_MULTIPROC_METHOD=spawn keep vLLM's spawn, and outside Ray vLLM forks by itself), the forked
process shows vLLM's title in `ps` although Ray has taken over the worker's argv, and it lets go of the
actor's sockets: a SIGKILLed actor is known dead to Ray at once (a child holding the worker's raylet
connection hid the death until the caller's own deadline), and Ray then reaps the child. (A whole engine forked from an actor: every end-to-end run; its
death with the actor: tests/e2e/test_fleet_e2e.py.)"""

from __future__ import annotations

import os
import signal
import time

import pytest

from actors.engine_fork import ForkContext, forks_engine_core


def report_title(queue) -> None:
    with open("/proc/self/cmdline", "rb") as f:
        queue.put(f.read().split(b"\0")[0].decode())


def sleep_long() -> None:
    time.sleep(300)


class Probe:
    def fork_sleeper(self) -> tuple[int, int]:
        """(this actor's pid, a forked child's): the child holds copies of every socket Ray's worker had."""
        p = ForkContext().Process(target=sleep_long, name="EngineCore")
        p.start()
        return os.getpid(), p.pid

    def ping(self) -> str:
        return "pong"

    def decisions(self) -> dict:
        os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
        cpu, gpu = forks_engine_core(cpu=True), forks_engine_core(cpu=False)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        asked_spawn = forks_engine_core(cpu=True)
        del os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
        return {"cpu": cpu, "gpu": gpu, "asked_spawn": asked_spawn}

    def fork_title(self) -> tuple[str, str]:
        ctx = ForkContext()
        queue = ctx.Queue()
        p = ctx.Process(target=report_title, args=(queue,), name="EngineCore")
        p.start()
        title = queue.get(timeout=60)
        p.join(timeout=60)
        with open("/proc/self/cmdline", "rb") as f:
            mine = f.read().split(b"\0")[0].decode()
        return title, mine


@pytest.fixture(scope="module")
def probe():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield ray.remote(Probe).options(num_cpus=0).remote()
    ray.shutdown()


def test_a_cpu_engine_in_a_ray_actor_forks_its_core_and_nothing_else_does(probe):
    import ray

    assert ray.get(probe.decisions.remote()) == {"cpu": True, "gpu": False, "asked_spawn": False}
    assert not forks_engine_core(cpu=True)  # not in a Ray actor: vLLM's own choice (fork) stands


def test_the_forked_process_shows_vllms_title_in_a_ray_worker(probe):
    import ray

    title, mine = ray.get(probe.fork_title.remote())
    assert mine.startswith("ray::Probe"), mine  # Ray's title of the worker, which broke setproctitle
    assert title == "VLLM::EngineCore", title



def test_an_actor_killed_beside_its_forked_child_is_dead_to_ray_at_once_and_the_child_goes(probe):
    import ray

    actor = ray.remote(Probe).options(num_cpus=0).remote()
    pid, child = ray.get(actor.fork_sleeper.remote())
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):  # not GetTimeoutError: Ray saw the process go
        ray.get(actor.ping.remote(), timeout=60)
    assert time.monotonic() - t0 < 30
    deadline = time.monotonic() + 30  # Ray kills the dead worker's process group (launch.processes.process_graph)
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}"):
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{child}"), "the forked child outlived its actor"
