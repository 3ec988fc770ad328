"""The steps of bench/gpu/gpu_smoke_two.py: learner rank 0 on one GPU, one vLLM engine (TP 1) on another, the run's own
pieces (`launch.doctor.weights.WeightPeer`: the learner's model and `WeightSender`; the engine with the actors'
`WeightReceiver`), the engine in a child process of its own. One step per call, printing `SMOKE {json}` last:

  push             connect, a dense push, a delta push; the engine serves the delta's version. With NCCL_DEBUG=INFO
                   (NCCL_DEBUG_SUBSYS=INIT,NET, NCCL_DEBUG_FILE) it records how many lines of NCCL's log were
                   written by the end of the rendezvous and by the end of the first push, for `ring_connect`
  ring_connect     reads that log (review gpu_path_3 F6): are the broadcast ring's connections ("via P2P", "via
                   NET", "Connected all rings") made at the join, or only inside the first push?
  kill_rejoin      the engine's processes stopped, a push announced, the processes killed mid-push: the push fails
                   naming the receiver within seconds; a new engine joins a new group and serves a dense push
  stalled_rebuild  F1: a group of two receivers whose second never joins, while the engine decodes a watched
                   request with rollout deadlines of 3 s; the learner gives up after 20 s: the engine's join must
                   end then, the engine must not be wedged, and the request must finish
  async_aborts     (e): half the samples of a request aborted mid-decode as the watchdog aborts them (internal ids);
                   on GPUs async scheduling is on. They end "abort", the others finish, the engine keeps stepping

`--device cpu` runs the same on CPU (gloo weight sync, a CPU engine), to check this code where there is no GPU:

    python bench/gpu/gpu_smoke_two_steps.py --step push --work /tmp/two            # on a machine with 2 GPUs
    python bench/gpu/gpu_smoke_two_steps.py --step push --work /tmp/two --device cpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

RING = re.compile(r"via (P2P|NET|SHM)|Connected all rings|Channel \d+/\d+ : \d+\[")
NCCL_LOG = "nccl.log"
CONTEXT = 4608  # the tiny model's context: 64 prompt tokens + responses of up to 4,544 (the F1 step decodes 4,000)


def config(device: str, model: str, **weight_sync):
    from configs.schema import RunConfig

    gpu = device == "cuda"
    return RunConfig(learner={"gpus_per_rank": 1.0 if gpu else 0.0},
                     rollout={"gpus_per_actor": 1.0 if gpu else 0.0, "max_response_tokens": CONTEXT - 64,
                              "engine": {"enforce_eager": True, "gpu_memory_utilization": 0.3 if gpu else None}},
                     data={"max_prompt_tokens": 64}, model={"path": model, "dtype": "bfloat16" if gpu else "float32"},
                     weight_sync={"backend": "nccl" if gpu else "gloo", **weight_sync})


# ---------------------------------------------------------------------------- the engine's process
def engine_main(conn, cfg_json: str, model: str, device: str) -> None:
    """The engine's process: answers (command, *args) from `conn` until "exit"."""
    os.setsid()  # its own process group: the kill step stops and kills it with vLLM's engine core
    if device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        if "NCCL_DEBUG_FILE" in os.environ:  # the learner's log is the one read; the engine writes its own
            os.environ["NCCL_DEBUG_FILE"] += ".engine"
    import asyncio

    from actors.deadlines import DeadlineClock, Watchdog, pausing
    from configs.schema import RunConfig
    from launch.doctor.weights import WeightPeer
    from weightsync.receiver import WeightReceiver

    peer = WeightPeer(RunConfig.model_validate_json(cfg_json), model, "engine")
    clock = DeadlineClock()
    jobs: dict = {}

    async def join(host, port, token):
        if peer._follow is not None:
            peer._follow.cancel()
        peer.receiver = WeightReceiver(pausing(peer.host.engine, clock), host, port, token=token, name="smoke-engine",
                                       initial_version=None)
        rank = await peer.receiver.init()
        peer._follow = asyncio.create_task(peer.receiver.run())
        return rank

    async def watched(progress_s: float, tokens: int):
        """One request of 4 samples under the rollout deadlines (actors.deadlines.Watchdog on `clock`)."""
        from vllm import SamplingParams

        dog = Watchdog(peer.host.engine, lambda: (progress_s, None), clock, name="smoke-engine")
        rid = f"watched-{time.monotonic_ns()}"
        dog.watch(rid)
        final = None
        params = SamplingParams(n=4, max_tokens=tokens, ignore_eos=True, detokenize=False)
        async for out in peer.host.engine.generate({"prompt_token_ids": [1, 2, 3]}, params, request_id=rid):
            final = out
        dog.done(rid, True)
        dog.close()
        return {"wedged": dog.wedged, "aborted": dog.counts["requests_aborted"],
                "finish": sorted({c.finish_reason for c in final.outputs}), "tokens": [len(c.token_ids)
                                                                                       for c in final.outputs]}

    async def aborts():
        from vllm import SamplingParams

        engine, rid = peer.host.engine, f"aborts-{time.monotonic_ns()}"
        params = SamplingParams(n=8, max_tokens=400, ignore_eos=True, detokenize=False)
        stream = engine.generate({"prompt_token_ids": [1, 2, 3]}, params, request_id=rid)
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(1.0)
        ids = list(engine.output_processor.external_req_ids.get(rid, ()))[:4]
        await engine.abort(ids, internal=True)  # as actors.deadlines.Watchdog does
        final = await first
        async for out in stream:
            final = out
        after = SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False)
        later = [o async for o in engine.generate({"prompt_token_ids": [4, 5]}, after, request_id=rid + "-after")]
        return {"aborted": len(ids), "finish": [c.finish_reason for c in final.outputs],
                "after_tokens": len(later[-1].outputs[0].token_ids), "errored": bool(engine.errored)}

    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "exit":
                peer.close()
                conn.send(("ok", None))
                return
            if cmd == "start":
                out = peer.start_engine()
            elif cmd == "join":
                jobs["join"] = peer.host.submit(join(*args))
                out = None
            elif cmd == "watch":
                jobs["watch"] = peer.host.submit(watched(*args))
                out = None
            elif cmd in ("join_result", "watch_result"):
                out = jobs[cmd.split("_")[0]].result(timeout=args[0])
            elif cmd == "serving":
                out = peer.serving()
            elif cmd == "aborts":
                out = peer.host.call(aborts(), timeout_s=120)
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", out))
        except Exception as e:  # noqa: BLE001 - the parent reports it
            conn.send(("error", f"{type(e).__name__}: {str(e)[:500]}"))


class Engine:
    """The parent's handle on an engine process."""

    def __init__(self, cfg, model: str, device: str):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=engine_main, args=(child, cfg.model_dump_json(), model, device))  # vLLM starts children
        self.proc.start()

    def ask(self, *cmd, timeout_s: float = 300.0):
        self.conn.send(cmd)
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"the engine did not answer {cmd[0]!r} within {timeout_s:.0f} s")
        status, out = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"engine {cmd[0]}: {out}")
        return out

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(Exception):  # killed below when it does not exit
                self.ask("exit", timeout_s=60)
        if self.proc.is_alive():
            self.signal(signal.SIGKILL)
        self.proc.join(10)


# ---------------------------------------------------------------------------- steps (learner side)
def group(learner, engines: list[Engine], receivers: int, token: str) -> float:
    """A new weight-sync group: the engines join while the learner connects; seconds it took."""
    t0 = time.monotonic()
    host, port = learner.open_group(receivers, token)
    for e in engines:
        e.ask("join", host, port, token)
    learner.connect()
    for e in engines:
        e.ask("join_result", 120)
    return time.monotonic() - t0


def log_lines(work: Path) -> int:
    path = work / NCCL_LOG
    return len(path.read_text(errors="replace").splitlines()) if path.exists() else 0


def step_push(learner, cfg, model, work, device, token) -> dict:
    engine = Engine(cfg, model, device)
    try:
        engine.ask("start")
        connect_s = group(learner, [engine], 1, token)
        at_join = log_lines(work)
        full = learner.push(1)
        at_push = log_lines(work)
        delta = learner.push(2, change=0.01)
        serving = engine.ask("serving")
        assert serving["label"] == "2" and set(serving["token_labels"]) == {"2"}, serving
        assert (full["mode"], delta["mode"]) == ("full", "delta"), (full, delta)
        (work / "push.json").write_text(json.dumps({"log_at_join": at_join, "log_at_first_push": at_push}))
        return {"summary": f"connect {connect_s:.1f} s, dense {full['bytes']:,} B in {full['seconds']:.2f} s, delta "
                           f"{delta['bytes']:,} B ({delta['changed_frac']:.1%} changed) in {delta['seconds']:.2f} s; "
                           f"the engine serves version 2", "full": full, "delta": delta, "connect_s": connect_s}
    finally:
        engine.close()


def step_ring_connect(work: Path) -> dict:
    marks = json.loads((work / "push.json").read_text())
    lines = (work / NCCL_LOG).read_text(errors="replace").splitlines() if (work / NCCL_LOG).exists() else []
    if not lines:
        raise SystemExit("no NCCL log: the push step did not run with NCCL_DEBUG=INFO (or not on NCCL)")
    at_join = sum(bool(RING.search(ln)) for ln in lines[:marks["log_at_join"]])
    in_push = sum(bool(RING.search(ln)) for ln in lines[marks["log_at_join"]:marks["log_at_first_push"]])
    where = "at the join (build_ring works)" if at_join and not in_push else (
        "inside the first push (lazy connect: F6 holds)" if in_push else "nowhere the pattern finds")
    return {"summary": f"ring connections made {where}: {at_join} line(s) by the end of the rendezvous, {in_push} "
                       "during the first push", "at_join": at_join, "in_first_push": in_push,
            "examples": [ln for ln in lines if RING.search(ln)][:6]}


def step_kill_rejoin(learner, cfg, model, work, device, token) -> dict:
    engine = Engine(cfg, model, device)
    engine.ask("start")
    group(learner, [engine], 1, token)
    learner.push(1)
    engine.signal(signal.SIGSTOP)  # it cannot enter the next push ...
    box: dict = {}
    t0 = time.monotonic()
    pushing = threading.Thread(target=lambda: box.update(result=_try(learner.push, 2)), daemon=True)
    pushing.start()
    time.sleep(1.0)
    engine.signal(signal.SIGKILL)  # ... and dies in it
    pushing.join(120)
    failed_s = time.monotonic() - t0
    error = box.get("result", "the push did not end within 120 s")
    assert isinstance(error, str) and "smoke-engine" in error, f"the push should fail naming the receiver: {error}"
    engine.proc.join(10)
    again = Engine(cfg, model, device)
    try:
        again.ask("start")
        rejoin_s = group(learner, [again], 1, token)
        stats = learner.push(3)
        serving = again.ask("serving")
        assert stats["mode"] == "full" and serving["label"] == "3", (stats, serving)
    finally:
        again.close()
    return {"summary": f"the push failed {failed_s:.1f} s after it began, naming the killed engine; a new engine "
                       f"joined a new group in {rejoin_s:.1f} s and serves a dense push of version 3",
            "error": error[:400], "failed_s": failed_s, "rejoin_s": rejoin_s}


def step_stalled_rebuild(learner, cfg, model, work, device, token) -> dict:
    engine = Engine(cfg, model, device)
    try:
        engine.ask("start")
        engine.ask("watch", 3.0, 4000 if device == "cuda" else 300)  # progress_s 3 s; decodes through the join
        time.sleep(1.0)
        t0 = time.monotonic()
        host, port = learner.open_group(2, token)  # a second receiver that never comes
        engine.ask("join", host, port, token)
        learner_error = _try(learner.connect)
        try:
            engine.ask("join_result", 60)
            join = "joined (unexpected)"
        except RuntimeError as e:
            join = str(e)
        released_s = time.monotonic() - t0
        watched = engine.ask("watch_result", 300)
        assert watched["wedged"] is None, f"F1: the engine was declared wedged: {watched['wedged']}"
        assert watched["finish"] == ["length"], watched
        return {"summary": f"the learner gave up ({str(learner_error)[:120]}); the engine's join ended "
                           f"{released_s:.1f} s after the rebuild began; not wedged, the watched request finished "
                           f"({watched['tokens']} tokens)", "join": join[:400], "watched": watched,
                "released_s": released_s}
    finally:
        engine.close()


def step_async_aborts(learner, cfg, model, work, device, token) -> dict:
    engine = Engine(cfg, model, device)
    try:
        engine.ask("start")
        got = engine.ask("aborts")
        assert got["finish"].count("abort") == got["aborted"] == 4 and not got["errored"], got
        assert got["after_tokens"] == 8, got
        return {"summary": f"{got['aborted']} of 8 samples aborted mid-decode ({got['finish']}); the next request "
                           "generated its 8 tokens", **got}
    finally:
        engine.close()


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


STEPS = {"push": step_push, "kill_rejoin": step_kill_rejoin, "stalled_rebuild": step_stalled_rebuild,
         "async_aborts": step_async_aborts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", required=True, choices=[*STEPS, "ring_connect"])
    ap.add_argument("--work", required=True, type=Path, help="a folder the steps share (the model, the NCCL log)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.step == "ring_connect":
        print("SMOKE " + json.dumps(step_ring_connect(args.work)), flush=True)
        return 0
    if args.device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # the engine's process takes GPU 1
        if args.step == "push":
            os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                              NCCL_DEBUG_FILE=str(args.work / NCCL_LOG))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from launch.doctor.weights import WeightPeer
    from tasks.tiny_model import build_tiny_model

    model = str(build_tiny_model(args.work / "model", max_position_embeddings=CONTEXT))
    cfg = config(args.device, model, connect_timeout_s=20.0 if args.step == "stalled_rebuild" else 120.0)
    learner = WeightPeer(cfg, model, "learner")
    try:
        out = STEPS[args.step](learner, cfg, model, args.work, args.device, secrets.token_hex(16))
    finally:
        learner.close()
    print("SMOKE " + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
