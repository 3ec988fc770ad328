"""Buffer throughput vs a bare ZMQ PUSH/PULL + msgpack loop moving the same bytes, measured in one run.

For each sample length (1k and 8k tokens; groups of --group-size samples) it times
  buffer: an actor process (BufferClient: credit + push_groups of --push-chunk groups) -> the buffer
          service process -> the learner (this process: pull_batch of --batch groups, bumping the version
          each step), real sockets, real validation, real staleness bound (--max-staleness);
  bare:   a producer process PUSHing one msgpack map per group (the same array bytes as `bin` fields) ->
          this process PULLing and unpacking it into numpy arrays (one hop);
  relay:  the bare loop through a do-nothing PULL->PUSH relay process (two hops, like any broker);
interleaving them --reps times, and prints one JSON line per setting with the median samples/s, the
median paired ratio buffer/bare (goal >= 0.8) and buffer/relay, and CPU microseconds per sample of each
path (all its processes, zmq I/O threads included). Machines are noisy: compare ratios, not absolutes.

    python bench/perf/buffer_bench.py [--tokens 1024 8192] [--mb 150] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402
import zmq  # noqa: E402

from bench.common.cpu_roles import cpu_seconds  # noqa: E402
from buffer.client import BufferClient  # noqa: E402
from buffer.process import start_buffer_process  # noqa: E402
from buffer.records import Group, Sample  # noqa: E402
from tests.buffer.batching_client import BatchingClient  # noqa: E402  (push_groups: the wire's batched push)


def make_group(i: int, n: int, tokens: int, version: int = 0) -> Group:
    rng = np.random.default_rng(i)
    samples = [Sample(tokens=rng.integers(0, 32000, tokens, dtype=np.int32),
                      logprobs=-rng.random(tokens, dtype=np.float32), versions=np.full(tokens, version, np.int32),
                      prefix_mask=np.zeros(tokens, bool), reward=float(j % 2)) for j in range(n)]
    return Group(group_id=f"g{i}", prompt_index=i, prompt_tokens=rng.integers(0, 32000, 128, dtype=np.int32),
                 samples=samples, ground_truth="42", data_source="bench")


def _actor(address: str, groups: int, n: int, tokens: int, push_chunk: int, conn) -> None:
    client = BatchingClient(address, "bench-actor", timeout_s=60)
    protos = [make_group(i, n, tokens) for i in range(4)]
    conn.send_bytes(b"ready")
    conn.recv_bytes()
    sent = credit = version = 0
    cpu0 = time.process_time()
    while sent < groups:
        chunk = []
        for _ in range(min(credit, push_chunk, groups - sent)):
            g = protos[(sent + len(chunk)) % len(protos)]
            g = Group(**{**vars(g), "group_id": f"g{sent + len(chunk)}"})
            for s in g.samples:  # tokens carry the version the credit was granted at (weights load instantly)
                s.versions.fill(version)
            chunk.append(g)
        credit -= len(chunk)
        sent += len(chunk)
        want = min(64, groups - sent) - credit
        if want > 0 and credit < push_chunk:  # running low: push and ask for more work in one round trip,
            # waiting (in the buffer, no polling) only when there is nothing left to generate
            acks, c = client.push_and_request_credit(chunk, want, version, wait_s=30 if credit == 0 else 0)
            credit, version = credit + c.granted, c.learner_version
        elif push_chunk == 1:
            acks = [client.push_group(chunk[0])]
        else:
            acks = client.push_groups(chunk)
        assert all(a.accepted for a in acks), acks
    conn.send_bytes(str(time.process_time() - cpu0).encode())
    client.close()


def _bare_producer(address: str, groups: int, n: int, tokens: int, conn) -> None:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.connect(address)
    protos = [make_group(i, n, tokens) for i in range(4)]
    conn.send_bytes(b"ready")
    conn.recv_bytes()
    cpu0 = time.process_time()
    for k in range(groups):
        g = protos[k % len(protos)]
        msg = {"group_id": f"g{k}", "prompt_index": g.prompt_index, "prompt_tokens": g.prompt_tokens.tobytes(),
               "rewards": [s.reward for s in g.samples], "lengths": [len(s.tokens) for s in g.samples],
               **{f: b"".join(getattr(s, f).tobytes() for s in g.samples)
                  for f in ("tokens", "logprobs", "versions", "prefix_mask")}}
        sock.send(msgpack.packb(msg, use_bin_type=True))
    sock.close(linger=-1)
    zmq.Context.instance().term()  # blocks until everything queued is delivered (the child exits via os._exit)
    conn.send_bytes(str(time.process_time() - cpu0).encode())


def _relay(out_address: str, groups: int, conn) -> None:
    """A do-nothing broker: PULL -> PUSH, zero-copy, no parsing (the floor for any two-hop design)."""
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(out_address)
    conn.send_bytes(str(port).encode())
    cpu0 = time.process_time()
    for _ in range(groups):
        push.send(pull.recv(copy=False), copy=False)
    pull.close(0)
    push.close(linger=-1)
    ctx.term()
    conn.send_bytes(str(time.process_time() - cpu0).encode())


def _spawn(target, *args):
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe()
    p = ctx.Process(target=target, args=(*args, send), daemon=True)
    p.start()
    assert recv.recv_bytes() == b"ready"
    return p, recv


def run_buffer(groups: int, n: int, tokens: int, batch: int, push_chunk: int, k: int) -> tuple[float, float]:
    """-> (samples/s, CPU seconds of actor + buffer + learner)."""
    proc, address = start_buffer_process(None, batch_prompts=batch, max_staleness=k,
                                         capacity_groups=(k + 2) * batch, max_message_mb=256)
    learner = BufferClient(address, "bench-learner", timeout_s=60)
    actor, conn = _spawn(_actor, address, groups, n, tokens, push_chunk)
    buf_cpu0, cpu0 = cpu_seconds(proc.pid), time.process_time()
    t0 = time.perf_counter()
    conn.send_bytes(b"go")
    got, version = 0, 0
    while got < groups:  # each step: the version advances, then the next batch is pulled (one round trip)
        batch_groups = learner.pull_batch(batch, timeout_s=60, version=version)
        got += len(batch_groups)
        assert all(len(s.tokens) == tokens for g in batch_groups for s in g.samples)
        version += 1
    dt = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + cpu_seconds(proc.pid) - buf_cpu0 + float(conn.recv_bytes())
    stats = learner.stats()
    assert stats["rejected_total"] == 0, stats
    actor.join(30)
    learner.close()
    proc.terminate()
    proc.join(10)
    return groups * n / dt, cpu


def run_bare(groups: int, n: int, tokens: int, relay: bool = False) -> tuple[float, float]:
    """-> (samples/s, CPU seconds of producer (+ relay) + consumer)."""
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.RCVTIMEO, 120_000)  # fail loudly rather than hang
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    if relay:
        ctx = mp.get_context("spawn")
        rconn, send = ctx.Pipe()
        rproc = ctx.Process(target=_relay, args=(address, groups, send), daemon=True)
        rproc.start()
        address = f"tcp://127.0.0.1:{int(rconn.recv_bytes())}"
    producer, conn = _spawn(_bare_producer, address, groups, n, tokens)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    conn.send_bytes(b"go")
    for _ in range(groups):
        m = msgpack.unpackb(sock.recv(), raw=False)
        arrays = {f: np.frombuffer(m[f], dt) for f, dt in (("tokens", "<i4"), ("logprobs", "<f4"),
                                                            ("versions", "<i4"), ("prefix_mask", "|b1"))}
        bounds = np.cumsum(m["lengths"])[:-1]
        parts = {f: np.split(a, bounds) for f, a in arrays.items()}
        assert len(parts["tokens"][0]) == tokens
    dt = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + float(conn.recv_bytes())
    if relay:
        cpu += float(rconn.recv_bytes())
        rproc.join(30)
    producer.join(30)
    sock.close(0)
    return groups * n / dt, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192], help="tokens per sample")
    ap.add_argument("--group-size", type=int, default=8, help="samples per group")
    ap.add_argument("--batch", type=int, default=8, help="groups per learner pull (batch_prompts)")
    ap.add_argument("--max-staleness", type=int, default=1, help="K of the buffer under test")
    ap.add_argument("--mb", type=float, default=150.0, help="array MiB moved per measurement")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--push-chunk", type=int, default=8, help="groups per push_groups call (1 = push_group)")
    args = ap.parse_args()
    for tokens in args.tokens:
        group_bytes = args.group_size * tokens * 13 + 128 * 4
        groups = max(args.batch, int(args.mb * (1 << 20) / group_bytes) // args.batch * args.batch)
        buf, bare, relay = [], [], []
        for _ in range(args.reps):  # interleaved, so all three see the same machine conditions
            bare.append(run_bare(groups, args.group_size, tokens))
            buf.append(run_buffer(groups, args.group_size, tokens, args.batch, args.push_chunk, args.max_staleness))
            relay.append(run_bare(groups, args.group_size, tokens, relay=True))
        samples = groups * args.group_size
        ratios = [x[0] / y[0] for x, y in zip(buf, bare)]
        b, r = statistics.median(x[0] for x in buf), statistics.median(y[0] for y in bare)
        rl = statistics.median(y[0] for y in relay)
        print(json.dumps({
            "setting": f"{tokens // 1024}k-token samples", "sample_tokens": tokens, "group_size": args.group_size,
            "batch": args.batch, "max_staleness": args.max_staleness, "push_chunk": args.push_chunk,
            "groups": groups, "array_mib": round(groups * group_bytes / (1 << 20), 1), "reps": args.reps,
            "buffer_samples_per_s": round(b, 1), "bare_samples_per_s": round(r, 1),
            "ratio": round(statistics.median(ratios), 3), "ratios_per_rep": [round(x, 3) for x in ratios],
            "buffer_MiB_per_s": round(b / args.group_size * group_bytes / (1 << 20), 1),
            "relay_samples_per_s": round(rl, 1),
            "ratio_vs_relay": round(statistics.median(x[0] / y[0] for x, y in zip(buf, relay)), 3),
            "buffer_cpu_us_per_sample": round(statistics.median(x[1] for x in buf) / samples * 1e6, 1),
            "bare_cpu_us_per_sample": round(statistics.median(y[1] for y in bare) / samples * 1e6, 1),
            "relay_cpu_us_per_sample": round(statistics.median(y[1] for y in relay) / samples * 1e6, 1),
            "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "zmq": zmq.zmq_version(),
        }), flush=True)


if __name__ == "__main__":
    main()
