"""Control-plane scale SIMULATION: the real buffer service, the real driver pull loop and N real actor
processes whose vLLM generation is replaced by a timer. No engine, no learner, no weights move.

What is real:
  - the buffer service process (`buffer.service`: admission, FIFO, staleness drops);
  - the driver side: one `BufferClient` pulling batches of B groups, then (like `launch.loop.driver`) the weight
    push and `set_version` (whose reply carries the buffer's stats) every step;
  - in each of N forked actor processes the production actor (`actors.core.AsyncActor`): credit requests,
    the width-bounded admit loop, the `Outbox` and its re-sends, the reconnecting `BufferLink`s.
What is simulated:
  - generation: a group takes gen_s = step_s seconds ±25 % (uniform), its rows stamped with the actor's version
    at the start (`SimActor.make_group`);
  - the learner step: a sleep of step_s;
  - the weight push: the driver writes the new version to each actor's pipe and the actor loads it at
    once, through the hook the weight receiver calls (`_loaded`).

Per N it prints one JSON line and a table row:
  fairness     Jain's index (Σx)² / (N·Σx²) of x = groups of each actor the learner trained (steps after
               the warm-up); 1 = equal shares, 1/N = one actor got everything
  overhead     driver time per step outside pull, step and push (set_version with its stats, batch checks):
               mean and max, and the mean as a share of the step
  msgs/s       requests the buffer received per second (its `messages` counter; all clients)
  above bound  rows trained whose staleness (learner version − the row's oldest token version) exceeds K:
               must be 0
plus groups/s, the buffer's dropped_stale, the driver's mean pull wait and credit requests per group.

Settings per N (PLAN): B = 2N prompts per step, K = 1, 8 prompts in flight per actor, capacity (K+2)·B,
so (K+1)·B = 4N credit units serve 8N wanted ones: every actor competes for credit. Generation is as fast
as the step (gen_s = step_s), so actors can produce twice what the learner takes and the learner
is never starved by generation speed, only by credit. The first --warmup steps are not measured.

CPU: on a real run the actors have cores (and nodes) of their own; here N processes share the machine
with the driver and the buffer, and when a batch of credit goes out all N wake at once. The actors run
at --actor-nice (default 19) so that the driver's overhead measures the control plane rather than the
scheduler; --actor-nice 0 shows the contention.

    python bench/perf/scale.py [--ns 2 8 32 128] [--actor-nice 19] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from actors.core import AsyncActor  # noqa: E402  (imported before forking: the children share it)
from actors.link import Outbox  # noqa: E402
from actors.prompts import PromptItem  # noqa: E402
from buffer.client import BufferClient  # noqa: E402
from buffer.process import start_buffer_process  # noqa: E402
from buffer.records import Group, Sample  # noqa: E402
from configs.schema import RunConfig  # noqa: E402

PLAN = {2: (0.25, 40), 8: (0.25, 40), 32: (0.5, 30), 128: (1.0, 40)}  # N -> (step_s, steps)
IN_FLIGHT, K = 8, 1
STOP = -1


def jain(x: list[int]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes all."""
    s, q = sum(x), sum(v * v for v in x)
    return s * s / (len(x) * q) if q else 1.0


def rows_above_bound(groups: list[Group], version: int, k: int) -> int:
    """Rows whose staleness (version − oldest version of the row's generated tokens) exceeds k."""
    return sum(int(version - s.on_policy_versions.min() > k) for g in groups for s in g.samples
               if s.on_policy_versions.size)


class _InstantWeights:
    """Stands in for the weight receiver: versions arrive through `AsyncActor._loaded`, with no pause."""

    last_pause = None

    async def close(self) -> None:
        pass


class SimActor(AsyncActor):
    """The production actor with generation replaced by a timer (no engine, no tokenizer, no sampler)."""

    def __init__(self, *args, gen_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.gen_s = gen_s
        self.rng = random.Random(self.actor_id)
        self.receiver = _InstantWeights()

    async def start(self, engine=None) -> None:
        self.engine = SimpleNamespace(errored=False)  # the loop checks only this of the engine
        self.outbox = Outbox(self.link, on_sent=self._on_sent)
        self._push_task = asyncio.create_task(self.outbox.run(), name=f"{self.name}-outbox")

    async def make_group(self, item: PromptItem, epoch: int = 0) -> Group:
        version = self.version
        await asyncio.sleep(self.gen_s * self.rng.uniform(0.75, 1.25))
        samples = [Sample(tokens=np.arange(8, dtype=np.int32), logprobs=np.full(8, -1.0, np.float32),
                          versions=np.full(8, version, np.int32), prefix_mask=np.zeros(8, bool), reward=float(j % 2))
                   for j in range(2)]
        self._counter += 1
        return Group(group_id=f"a{self.actor_id}-{self._counter}", prompt_index=item.prompt_index,
                     prompt_tokens=np.asarray(item.prompt_ids, np.int32), samples=samples, actor_id=self.actor_id,
                     meta={"actor_version": version, "epoch": epoch})


def sim_config(n: int, batch: int, capacity: int) -> RunConfig:
    cfg = RunConfig()
    cfg.rollout.num_actors, cfg.rollout.prompts_in_flight, cfg.rollout.gpus_per_actor = n, IN_FLIGHT, 0
    cfg.buffer.max_staleness, cfg.buffer.capacity_groups, cfg.learner.batch_prompts = K, capacity, batch
    return cfg


async def _actor_main(i: int, n: int, address: str, conn, batch: int, capacity: int, gen_s: float,
                      nice: int) -> None:
    os.nice(nice)
    prompts = [PromptItem(p, (1, 2, 3), "0") for p in range(64 * n)]
    actor = SimActor(sim_config(n, batch, capacity), i, "", address, prompts, num_actors=n, gen_s=gen_s)
    await actor.start()
    loop, stopped = asyncio.get_running_loop(), asyncio.Event()

    def on_push() -> None:  # the weight push: a new version, loaded at once (STOP ends the run)
        v = int(conn.recv_bytes())
        if v == STOP:
            loop.remove_reader(conn.fileno())
            stopped.set()
        elif v > actor.version:
            actor._loaded(v)

    loop.add_reader(conn.fileno(), on_push)
    actor.start_background()
    await stopped.wait()
    await actor.stop(drain=False)
    conn.send_bytes(json.dumps(actor.stats(), default=str).encode())
    await actor.close()


def _actor_proc(*args) -> None:
    asyncio.run(_actor_main(*args))


def run_one(n: int, step_s: float, steps: int, warmup: int, nice: int) -> dict:
    batch = 2 * n
    capacity = (K + 2) * batch
    proc, address = start_buffer_process(None, batch_prompts=batch, max_staleness=K, capacity_groups=capacity)
    gc.freeze()  # forked children then share the parent's objects instead of copying them on gc passes
    ctx = mp.get_context("fork")
    pipes, actors = [], []
    for i in range(n):
        here, there = ctx.Pipe()
        p = ctx.Process(target=_actor_proc, args=(i, n, address, there, batch, capacity, step_s, nice), daemon=True)
        p.start()
        there.close()
        pipes.append(here)
        actors.append(p)
    zctx = zmq.Context()  # terminated at the end: the next N forks from a parent without zmq threads
    client = BufferClient(address, "driver", timeout_s=60.0, context=zctx)
    per_actor, overhead, pull_s = [0] * n, [], []
    above = version = 0
    try:
        for step in range(steps):
            if step == warmup:
                t_measured, msgs0, out0 = time.monotonic(), client.stats().get("messages", 0), 0
            t0 = time.monotonic()
            while True:
                try:
                    groups = client.pull_batch(batch, timeout_s=5.0)
                    break
                except TimeoutError:  # the driver checks its actors' health here
                    pass
            t_pull = time.monotonic() - t0
            above += rows_above_bound(groups, version, K)
            t1 = time.monotonic()
            time.sleep(step_s)  # the learner step
            t_step = time.monotonic() - t1
            version += 1
            t2 = time.monotonic()
            for c in pipes:  # the weight push
                c.send_bytes(str(version).encode())
            t_push = time.monotonic() - t2
            stats = client.set_version(version)  # the buffer's stats come with it
            if step >= warmup:
                for g in groups:
                    per_actor[g.actor_id] += 1
                out0 += len(groups)
                pull_s.append(t_pull)
                overhead.append(time.monotonic() - t0 - t_pull - t_step - t_push)
        elapsed = time.monotonic() - t_measured
        msgs = stats.get("messages", 0) - msgs0
        for c in pipes:
            c.send_bytes(str(STOP).encode())
        reports = [json.loads(c.recv_bytes()) for c in pipes if c.poll(60)]
    finally:
        for p in actors:
            p.join(30)
            if p.is_alive():
                p.kill()
        client.close()
        zctx.term()
        proc.terminate()
        proc.join(10)
    return {"actors": n, "batch_prompts": batch, "max_staleness": K, "capacity_groups": capacity,
            "prompts_in_flight": IN_FLIGHT, "actor_nice": nice, "step_s": step_s, "gen_s": step_s, "steps": steps, "warmup": warmup,
            "fairness": round(jain(per_actor), 4), "groups_min": min(per_actor), "groups_max": max(per_actor),
            "overhead_ms": round(1000 * statistics.mean(overhead), 2), "overhead_max_ms": round(1000 * max(overhead), 2),
            "overhead_pct": round(100 * statistics.mean(overhead) / step_s, 2),
            "msgs_per_s": round(msgs / elapsed, 1), "groups_per_s": round(out0 / elapsed, 1),
            "rows_above_bound": above, "dropped_stale": stats["dropped_stale"],
            "pull_wait_ms": round(1000 * statistics.mean(pull_s), 1),
            "credit_requests_per_group": round(sum(r["credit_requests"] for r in reports) /
                                               max(1, sum(r["groups_acked"] for r in reports)), 2),
            "reports": len(reports), "groups_per_actor": per_actor}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=sorted(PLAN), help="actor counts (each in PLAN)")
    ap.add_argument("--warmup", type=int, default=3, help="first steps not measured")
    ap.add_argument("--actor-nice", type=int, default=19, help="niceness of the actor processes (see CPU above)")
    ap.add_argument("--json", help="also write the results (one JSON object per N) to this file")
    args = ap.parse_args()
    print(f"# control-plane SIMULATION (no vLLM, no learner): {platform.node()}, {os.cpu_count()} cores, "
          f"actors at nice {args.actor_nice}", flush=True)
    results = []
    for n in args.ns:
        step_s, steps = PLAN[n]
        r = run_one(n, step_s, steps, args.warmup, args.actor_nice)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "groups_per_actor"}), flush=True)
    print("\n| N | B | step | fairness (min–max groups) | overhead mean / max (% of step) | msgs/s | groups/s "
          "| rows above K | dropped_stale | pull wait | credit req/group |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['actors']} | {r['batch_prompts']} | {r['step_s']} s | {r['fairness']:.3f} ({r['groups_min']}–"
              f"{r['groups_max']}) | {r['overhead_ms']:.1f} / {r['overhead_max_ms']:.1f} ms ({r['overhead_pct']:.1f} %) "
              f"| {r['msgs_per_s']:.0f} | {r['groups_per_s']:.0f} | {r['rows_above_bound']} | {r['dropped_stale']} "
              f"| {r['pull_wait_ms']:.0f} ms | {r['credit_requests_per_group']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
