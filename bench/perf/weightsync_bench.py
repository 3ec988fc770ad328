"""Weight-sync throughput: WeightSender -> 2 receivers, against a bare gloo broadcast of one flat buffer
of the same size measured in the same run (ratios, not absolute times, are the result on noisy boxes).

Cases (one JSON line each, plus one line describing the machine):
  tiny          the embedded tiny Llama (fp32, 1.7 MB), received by 2 real vLLM engines (our "gloo"
                transfer engine, full pause/start/update/finish/resume cycle)
  qwen05b       a randomly initialised Qwen2-0.5B-shaped model (bf16, 0.99 GB), received by 2 plain
                gloo receiver processes (weightsync.gloo.plain_receiver: same framing, unpacking and acks;
                copies into a dict where vLLM would run load_weights)
  qwen05b-vllm  the same model received by 2 real vLLM engines (~4 GB RSS each; slow to start)
Each push is timed end to end (announce -> every receiver acknowledged the loaded version); the bare
baseline broadcasts one flat uint8 buffer of the same size to 2 other processes, alternating with the
pushes so both see the same load. Run:
``.venv/bin/python bench/perf/weightsync_bench.py [--cases tiny qwen05b qwen05b-vllm] [--pushes 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-weight-sync-token"  # the weight-sync admission token (a run generates its own per run)
sys.path.insert(0, str(ROOT))


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


# --------------------------------------------------------------------------- bare gloo baseline
def _bare_pg(host: str, port: int, rank: int, world: int):
    import torch.distributed as dist

    store = dist.TCPStore(host, port, None if rank else world, rank == 0, timeout=timedelta(seconds=300),
                          wait_for_workers=False)
    return store, dist.ProcessGroupGloo(dist.PrefixStore("bare", store), rank, world, timedelta(seconds=300))


def bare_receiver(host: str, port: int, rank: int, world: int, nbytes: int, iters: int) -> None:
    import torch

    _, pg = _bare_pg(host, port, rank, world)
    for _ in range(iters):
        buf = torch.empty(nbytes, dtype=torch.uint8)  # fresh buffer, like the real receivers
        pg.broadcast(buf, 0).wait()


class BareBroadcast:
    """Root of a plain gloo group with ``receivers`` processes that just receive flat buffers. Kept
    alive beside the weight-sync receivers so the two measurements alternate under the same load."""

    def __init__(self, nbytes: int, iters: int, receivers: int = 2):
        import socket

        import torch

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.procs = [subprocess.Popen([sys.executable, __file__, "--bare-receiver", str(port), str(r),
                                        str(receivers + 1), str(nbytes), str(iters + 1)], cwd=ROOT)
                      for r in range(1, receivers + 1)]
        self.store, self.pg = _bare_pg("127.0.0.1", port, 0, receivers + 1)
        self.buf = torch.ones(nbytes, dtype=torch.uint8)
        self.once()  # warm-up (connections, first-touch page faults)

    def once(self) -> float:
        t0 = time.perf_counter()
        self.pg.broadcast(self.buf, 0).wait()
        return time.perf_counter() - t0

    def close(self) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


# --------------------------------------------------------------------------- receivers
def engine_receiver(host: str, port: int, name: str, model: str, dtype: str) -> None:
    """An actor: AsyncLLM + WeightReceiver.run() until stdin closes."""
    import asyncio

    async def run() -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from weightsync.receiver import WeightReceiver, engine_args_kwargs

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=model, dtype=dtype, max_model_len=512, enforce_eager=True, **engine_args_kwargs()))
        rx = WeightReceiver(engine, host, port, token=TOKEN, name=name)
        await rx.init()
        stop = asyncio.Event()
        task = asyncio.create_task(rx.run(stop))
        await asyncio.to_thread(sys.stdin.read)
        stop.set()
        await task
        engine.shutdown()

    asyncio.run(run())


def start_receivers(kind: str, address: tuple[str, int], model_dir: str | None, dtype: str, n: int = 2):
    procs = []
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    for i in range(n):
        if kind == "vllm":
            cmd = [sys.executable, __file__, "--engine-receiver", address[0], str(address[1]), f"engine-{i}",
                   model_dir, dtype]
            stdout = subprocess.DEVNULL
        else:
            cmd = [sys.executable, "-m", "weightsync.gloo.plain_receiver", "--host", address[0], "--port",
                   str(address[1]), "--name", f"plain-{i}", "--pushes", "1000000"]
            stdout = subprocess.DEVNULL
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=stdout,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        if kind == "plain":  # the plain receiver reads the token from its first stdin line
            proc.stdin.write(f"{TOKEN}\n".encode())
            proc.stdin.flush()
        procs.append(proc)
    return procs


def stop_receivers(procs, kind: str) -> None:
    if kind == "plain":  # idle in wait_for_push; nothing to flush
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(OSError):
            p.stdin.close()
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# --------------------------------------------------------------------------- cases
def qwen05b_model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=512,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    return model


def run_case(name: str, model, receiver_kind: str, pushes: int, bucket_mb: float, model_dir: str | None,
             dtype: str) -> dict:
    import torch

    from weightsync import WeightSender, full_named_tensors

    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sender = WeightSender(2, token=TOKEN, bucket_mb=bucket_mb, timeout_s=300, connect_timeout_s=600)
    procs = start_receivers(receiver_kind, sender.address, model_dir, dtype)
    bare = None
    try:
        t0 = time.perf_counter()
        sender.connect()
        connect_s = time.perf_counter() - t0
        bare = BareBroadcast(nbytes, iters=pushes)
        runs, bare_times = [], []
        for v in range(1, pushes + 2):
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)  # a real change every version
            stats = sender.push(full_named_tensors(model), version=v)
            if v > 1:  # the first push pays one-off costs (first-touch page faults, reload setup)
                runs.append(stats)
                bare_times.append(bare.once())  # alternate with the pushes: same load drift
    finally:
        stop_receivers(procs, receiver_kind)
        sender.close()
        if bare is not None:
            bare.close()
    secs = statistics.median(r["seconds"] for r in runs)
    bare_s = statistics.median(bare_times)
    bare = {"bare_s_median": bare_s, "bare_gbps": nbytes / bare_s / 1e9}
    sync_gbps = nbytes / secs / 1e9
    return {
        "case": name, "receivers": f"2 x {receiver_kind}", "bytes": nbytes,
        "params": sum(p.numel() for p in model.parameters()), "dtype": str(next(model.parameters()).dtype),
        "bucket_mb": bucket_mb, "buckets": runs[-1]["buckets"], "pushes": len(runs),
        "sync_s_median": secs, "send_s_median": statistics.median(r["send_s"] for r in runs),
        "ack_s_median": statistics.median(r["ack_s"] for r in runs), "connect_s": connect_s,
        "sync_gbps": sync_gbps, **bare, "ratio_vs_bare": sync_gbps / bare["bare_gbps"],
        "receiver_load_s": statistics.median(
            max(a["seconds"] for a in r["ack_info"].values()) for r in runs),
        "receiver_phases_s": _median_phases(runs),
    }


def _median_phases(runs: list[dict]) -> dict:
    """Median over pushes of the slowest receiver's time in each step (vLLM receivers only)."""
    names = [k for k in next(iter(runs[0]["ack_info"].values())).get("phases", {})]
    return {k: statistics.median(max(a["phases"][k] for a in r["ack_info"].values()) for r in runs)
            for k in names}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["tiny", "qwen05b", "qwen05b-vllm"],
                    choices=["tiny", "qwen05b", "qwen05b-vllm"])
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=256.0)
    args = ap.parse_args()

    import torch

    emit({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
          "torch": torch.__version__, "python": platform.python_version()})
    with tempfile.TemporaryDirectory() as tmp:
        if "tiny" in args.cases:
            from transformers import AutoModelForCausalLM

            from tasks.tiny_model import build_tiny_model

            d = build_tiny_model(Path(tmp) / "tiny")
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
            emit(run_case("tiny", model, "vllm", args.pushes, args.bucket_mb, str(d), "float32"))
        if "qwen05b" in args.cases or "qwen05b-vllm" in args.cases:
            model = qwen05b_model()
            if "qwen05b" in args.cases:
                emit(run_case("qwen05b", model, "plain", args.pushes, args.bucket_mb, None, "bfloat16"))
            if "qwen05b-vllm" in args.cases:
                from tasks.tiny_model import build_tokenizer

                d = str(Path(tmp) / "qwen05b")
                model.save_pretrained(d)
                build_tokenizer().save_pretrained(d)  # never used to generate; vLLM wants one
                emit(run_case("qwen05b-vllm", model, "vllm", args.pushes, args.bucket_mb, d, "bfloat16"))

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bare-receiver":
        bare_receiver("127.0.0.1", *(int(x) for x in sys.argv[2:7]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--engine-receiver":
        h, p, n, m, dt = sys.argv[2:7]
        engine_receiver(h, int(p), n, m, dt)
    else:
        main()
