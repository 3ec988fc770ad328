"""The weight check of `algo-train doctor` (`launch.doctor.weights`) in the parts that run without Ray or
vLLM: its learner peer starts like learner rank 0 (review gpu_path_2 N1), and its "abort" step makes the
sender abort the push half-way, on either backend, at once (N7). The whole check: tests/e2e/test_doctor_e2e.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launch.doctor.weights import unsendable
from tests.weightsync.plain_procs import start_plain_receivers, stop
from weightsync import WeightSender, WeightSyncError
from weightsync.nccl.plane import nccl_update_info
from weightsync.packing import pack_buckets
from weightsync.plane import Payload

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "c3" * 32

PEER = """
import json, os, sys
import psutil, torch.distributed as dist
from configs.loading import resolve
from launch.doctor.weights import WeightPeer
from tasks.tiny_model import build_tiny_model
model = build_tiny_model(sys.argv[1])
peer = WeightPeer(resolve("grpo", overrides=[f"learner.world_size={sys.argv[2]}"]), str(model), "learner")
seen = {"world": dist.get_world_size() if dist.is_initialized() else None,
        "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")},
        "listening": [c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]}
peer.close()
print(json.dumps(seen | {"closed": not dist.is_initialized()}))
"""


def _peer(tmp_path: Path, world: int) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", PEER, str(tmp_path / f"tiny-{world}"), str(world)], cwd=ROOT,
                         env=clean, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_doctors_learner_peer_starts_its_process_group_as_learner_rank_0_does(tmp_path):
    """N1: the doctor's sender ran in a process that never called `init_distributed`, so whatever a learner
    rank's start does to its process (it once set GLOO_SOCKET_IFNAME=lo for a one-rank learner on a
    cluster, cutting off every remote engine) the doctor could not see. Its learner peer now goes through
    rank 0's rendezvous (`launch.processes.roles.rank0_rendezvous`) and `init_distributed` before it makes
    the sender. One machine: a learner of 2 ranks rendezvouses on loopback, which keeps gloo and NCCL
    there (the variables are set as rank 0's would be); a learner of one opens no socket and sets nothing."""
    two = _peer(tmp_path, 2)
    assert two["world"] == 1 and two["closed"]  # a group of one, at the address rank 0 would serve
    assert two["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert "127.0.0.1" in two["listening"]  # rank 0's process-group store
    one = _peer(tmp_path, 1)
    assert one["world"] == 1 and one["env"] == {"GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}
    assert all(ip.startswith("127.") for ip in one["listening"]), one["listening"]


def _payload() -> Payload:
    g = torch.Generator().manual_seed(0)
    return Payload(version=3, seq=1, full=[(f"model.layers.{i}.mlp.up_proj.weight",
                                            torch.randn(64, 64, generator=g).to(torch.bfloat16)) for i in range(4)])


def test_the_abort_steps_tensor_is_announced_then_stops_the_sender_mid_push():
    """N7: the abort step's tensor was a complex64 one. NCCL sent it as bytes (the engines then failed in
    their loaders: a receiver failure, ~1.5 min at 7B width), and now the NCCL plane refuses it before
    announcing anything, so no engine even starts the push. The tensor is now of the wire dtype with no
    data: announced like any other (every engine starts receiving), then unreadable where a data plane
    first reads it — gloo's packer after the buckets before it, NCCL's producer when it copies it to the GPU."""
    old = _payload()
    old.full.insert(2, ("model.not_sendable", torch.zeros(2, dtype=torch.complex64)))
    with pytest.raises(TypeError, match="model.not_sendable"):
        nccl_update_info(old)  # what the old step now meets on NCCL: nothing is announced
    payload = _payload()
    unsendable(payload)
    info = nccl_update_info(payload)
    assert info["names"][2] == "model.not_sendable" and info["dtype_names"][2] == "bfloat16"
    packed = []
    with pytest.raises(NotImplementedError, match="meta tensor"):
        for bucket in pack_buckets(payload.full, 64 * 64 * 2):  # one tensor per bucket
            packed.append(bucket.header.names)
    assert packed[:1] == [["model.layers.0.mlp.up_proj.weight"]]  # a bucket went before it (the packer
    # groups a dtype's run of tensors ahead, so the one just before the poison goes no further)
    with pytest.raises(NotImplementedError, match="meta tensor"):
        payload.full[2][1].to("cpu")  # NCCL's producer: post_iter_func = tensor.to(device)


def test_the_sender_aborts_that_push_at_once_and_the_receiver_gives_it_up():
    """The step against a real sender and a plain gloo receiver: the push fails in the sender within
    seconds (not a receiver's deadline), and the receiver, half-way through it, gives it up."""
    procs = []
    sender = WeightSender(1, bucket_mb=64 * 64 * 2 / 2**20, timeout_s=60, connect_timeout_s=120, token=TOKEN)
    try:
        procs += start_plain_receivers(sender.address, ["rx"], token=TOKEN)
        sender.connect()
        payload = sender.prepare(iter(_payload().full), version=3)
        unsendable(payload)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match="Cannot copy out of meta tensor"):
            sender.send(payload)
        assert time.monotonic() - t0 < 10
        assert procs[0].wait(timeout=30) != 0
        assert "abort" in procs[0].stderr.read().decode().lower()
    finally:
        sender.close()
        stop(procs)
