"""A receiver without vLLM: same rendezvous, framing, unpacking and acknowledgements as the vLLM path.

Why: the sender's failure handling and throughput can be tested and benchmarked with receivers that
are cheap to start (no engine), e.g. for a 0.5B model on a 2-core box where two vLLM engines plus a
learner do not fit, and in fast tests that kill or freeze a receiver mid-push. The received tensors
are copied into a persistent ``{name: tensor}`` dict, which stands in for ``model.load_weights``.

Run as a process: ``python -m weightsync.gloo.plain_receiver --host H --port P --name N [--pushes K]``,
with the run's weight-sync token on the first line of stdin (never on the command line, where every
user of the machine could read it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from weightsync.gloo.group import iter_buckets, local_address_toward, new_gloo_group
from weightsync.liveness import Heartbeat, abort_probe
from weightsync.packing import unpack_bucket
from weightsync.protocol import (
    WeightSyncError,
    get_json,
    join_group,
    key_progress,
    key_push,
    key_rank,
    key_worker,
    post_ack,
    post_nack,
    process_info,
    set_json,
)


class PlainReceiver:
    def __init__(self, host: str, port: int, *, token: str, name: str, checksum: bool = False,
                 freeze_before_ack: bool = False):
        self.host, self.port, self.name = host, int(port), name
        self.token = token
        self.checksum = checksum
        self.freeze_before_ack = freeze_before_ack  # tests: SIGSTOP itself once loaded, before acking
        self.weights: dict[str, torch.Tensor] = {}
        self.version: int | None = None
        self.rank: int | None = None
        self._seq = 0

    def init(self) -> int:
        """Get admitted (raises ``WeightSyncError`` when refused) and join the gloo group; returns the rank."""
        store, cfg, rank, prefix = join_group(self.host, self.port, self.token, self.name)
        set_json(store, key_rank(rank), process_info(self.name))
        set_json(store, key_worker(rank), process_info(self.name))
        self.timeout_s = float(cfg["timeout_s"])
        self._heartbeat = Heartbeat(self.host, self.port, rank, prefix)
        self._pg = new_gloo_group(store, rank, int(cfg["world_size"]), self.timeout_s,
                                  local_host=local_address_toward(self.host, self.port),
                                  connect_timeout_s=float(cfg["connect_timeout_s"]))
        store.set_timeout(timedelta(seconds=self.timeout_s))
        self._store, self.rank = store, rank
        return rank

    def wait_for_push(self, timeout_s: float | None = None) -> int | None:
        key = key_push(self._seq + 1)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                return None
            try:
                self._store.wait([key], timedelta(seconds=left))  # wakes as soon as the key is set
            except dist.DistStoreError:
                continue
            return int(get_json(self._store, key)["version"])

    def apply_push(self) -> dict:
        seq = self._seq + 1
        version = int(get_json(self._store, key_push(seq))["version"])
        self._seq = seq
        t0 = time.monotonic()
        total = 0.0
        try:
            for b in iter_buckets(self._pg, self.timeout_s, aborted=abort_probe(self._store, seq)):
                if (b.header.seq, b.header.version) != (seq, version):
                    raise WeightSyncError(f"{self.name}: got push #{b.header.seq} v{b.header.version}, "
                                          f"expected #{seq} v{version}")
                for name, t in unpack_bucket(b.header, b.payload):
                    dst = self.weights.get(name)
                    if dst is None or dst.shape != t.shape or dst.dtype != t.dtype:
                        self.weights[name] = dst = torch.empty_like(t)
                    dst.copy_(t)
                    if self.checksum:
                        total += float(t.double().sum())
                self._store.add(key_progress(seq, self.rank), 1)
        except BaseException as e:
            self.version = None
            post_nack(self._store, seq, self.rank, repr(e))
            raise
        self.version = version
        ack = {"version": str(version), "seconds": time.monotonic() - t0}
        if self.checksum:
            ack["checksum"] = total
        if self.freeze_before_ack:
            os.kill(os.getpid(), signal.SIGSTOP)
        post_ack(self._store, seq, self.rank, ack)
        return ack

    def close(self) -> None:
        """Stops the heartbeat and tears the gloo group down in order, while the interpreter is whole
        (left to interpreter exit, gloo's threads can meet half-destroyed objects and abort the process)."""
        self._heartbeat.stop()
        with contextlib.suppress(Exception):  # a group whose peer already left may refuse
            self._pg.abort()
        self._pg = self._store = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--pushes", type=int, default=1, help="pushes to apply before exiting")
    ap.add_argument("--checksum", action="store_true", help="report the sum of received values in acks")
    ap.add_argument("--freeze-before-ack", action="store_true", help="tests: stop (SIGSTOP) once loaded")
    args = ap.parse_args(argv)
    token = sys.stdin.readline().strip()
    rx = PlainReceiver(args.host, args.port, token=token, name=args.name, checksum=args.checksum,
                       freeze_before_ack=args.freeze_before_ack)
    rx.init()
    try:
        for _ in range(args.pushes):
            rx.wait_for_push()
            rx.apply_push()
    finally:
        rx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
