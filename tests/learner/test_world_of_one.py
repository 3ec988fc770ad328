"""A learner of one rank opens no rendezvous and leaves the socket-interface variables as it found them
(review gpu_path_2 N1): that process then hosts the weight sync, whose gloo group and NCCL bootstrap read
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, so setting them to loopback there cut off every remote engine."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os
import psutil, torch, torch.distributed as dist
from learner.distributed import init_distributed
init_distributed(0, 1, torch.device("cpu"))
t = torch.tensor([2.0]); dist.all_reduce(t)
listening = [c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
print(json.dumps({"sum": float(t), "listening": listening,
                  "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env}, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_world_of_one_changes_no_environment_and_listens_on_loopback_only():
    seen = _probe()
    assert seen["sum"] == 2.0  # the group works (all_reduce of one rank)
    assert seen["env"] == {"GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}
    # gloo makes its device for the group of one on loopback while the group is built: nothing a
    # stranger on the node's network could reach, and no store served at all
    assert all(ip.startswith("127.") for ip in seen["listening"]), seen["listening"]


def test_a_world_of_one_keeps_what_the_user_set():
    assert _probe(GLOO_SOCKET_IFNAME="lo")["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None}
