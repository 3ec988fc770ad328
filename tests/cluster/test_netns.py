"""The two-host harness itself: the Ray cluster forms across the veth, B reaches A only by A's address
(B's 127.0.0.1 is its own), the TCP watch sees a refused loopback dial, and the shared-storage check
passes for a shared folder and stops for one that B cannot see."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.netns import IP
from tests.cluster.tcpwatch import refused_loopback

# Listen on each address of argv[1] (comma-separated) at port argv[2]; answer argv[3] to every
# connection; print "ready" once listening; run until stdin closes.
SERVE = """
import socket, sys, threading
def serve(s):
    while True:
        c, _ = s.accept()
        c.sendall(sys.argv[3].encode())
        c.close()
for host in sys.argv[1].split(","):
    s = socket.socket()
    s.bind((host, int(sys.argv[2])))
    s.listen()
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

# Dial every HOST:PORT of argv; print {target: what it answered, or the error's name}.
DIAL = """
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as c:
            out[target] = c.recv(16).decode()
    except OSError as e:
        out[target] = type(e).__name__
print(json.dumps(out))
"""

# From a driver on A: the storage check against every other node, for a shared folder and a hidden one.
STORAGE = """
import json, sys, ray
from launch.state.storage import StorageError, check_shared_storage, other_nodes
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
nodes = other_nodes()
out = {"nodes": [n.ip for n in nodes]}
for name, run_dir in (("shared", sys.argv[2]), ("hidden", sys.argv[3])):
    try:
        check_shared_storage(run_dir, nodes, {"model.cache_dir": run_dir})
        out[name] = "ok"
    except StorageError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def serve(hosts, host: str, addresses: str, port: int, answer: str) -> subprocess.Popen:
    proc = hosts.popen(host, sys.executable, "-c", SERVE, addresses, str(port), answer, stdin=subprocess.PIPE,
                       text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def dial(hosts, host: str, *targets: str) -> dict:
    return json.loads(hosts.python(host, DIAL, *targets).stdout)


@pytest.fixture(scope="module")
def a_port(two_hosts):
    """A port on which A answers "A", on its own address and on its loopback."""
    port = random.randrange(30000, 40000)
    server = serve(two_hosts, "A", f"{IP['A']},127.0.0.1", port, "A")
    yield port
    server.stdin.close()
    server.wait(timeout=10)


def test_the_cluster_forms_with_one_node_per_host(two_hosts):
    by_ip = {n["ip"]: n["resources"] for n in two_hosts.nodes}  # ray.nodes(), asked from inside A
    assert sorted(by_ip) == [IP["A"], IP["B"]]
    assert by_ip[IP["A"]].get("hostA") == 100 and "hostB" not in by_ip[IP["A"]]
    assert by_ip[IP["B"]].get("hostB") == 100 and "hostA" not in by_ip[IP["B"]]
    print(f"[two-hosts] bring-up took {two_hosts.startup_s:.1f} s")


def test_b_reaches_a_by_its_address_and_its_loopback_is_its_own(two_hosts, a_port):
    assert dial(two_hosts, "A", f"127.0.0.1:{a_port}") == {f"127.0.0.1:{a_port}": "A"}
    assert dial(two_hosts, "B", f"{IP['A']}:{a_port}", f"127.0.0.1:{a_port}") == {
        f"{IP['A']}:{a_port}": "A", f"127.0.0.1:{a_port}": "ConnectionRefusedError"}
    own = serve(two_hosts, "B", "127.0.0.1", a_port, "B")
    try:
        assert dial(two_hosts, "B", f"127.0.0.1:{a_port}") == {f"127.0.0.1:{a_port}": "B"}
    finally:
        own.stdin.close()
        own.wait(timeout=10)


def test_the_tcp_watch_sees_a_refused_loopback_dial_and_the_dial_across(two_hosts, a_port, tmp_path):
    records = tmp_path / "tcp.jsonl"
    watch = two_hosts.popen("B", sys.executable, "-m", "tests.cluster.tcpwatch", str(records), text=True)
    assert watch.stdout.readline().strip() == "ready"
    dial(two_hosts, "B", f"127.0.0.1:{a_port}", f"{IP['A']}:{a_port}")
    time.sleep(0.5)
    watch.send_signal(signal.SIGTERM)
    watch.wait(timeout=10)
    seen = [json.loads(line) for line in records.read_text().splitlines()]
    assert [server for _, server in refused_loopback(seen)] == [a_port]
    across = [r for r in seen if r["if"] == two_hosts.veth("B") and r["flags"] == "S"]
    assert [(r["out"], r["src"], r["dst"], r["dport"]) for r in across] == [(True, IP["B"], IP["A"], a_port)]


def test_the_storage_check_passes_for_a_shared_folder_and_stops_for_one_b_cannot_see(two_hosts, tmp_path):
    shared = tmp_path / "run"
    hidden = two_hosts.hidden_on_b / "run"  # A sees it; B sees an empty tmpfs in its place
    shared.mkdir()
    hidden.mkdir()
    out = json.loads(two_hosts.python("A", STORAGE, two_hosts.head_address, str(shared), str(hidden)).stdout
                     .strip().splitlines()[-1])
    assert out["nodes"] == [IP["B"]]  # the driver's own node (A) is not probed
    assert out["shared"] == "ok"
    assert f"node {IP['B']} (Ray node " in out["hidden"]
    assert f"cannot read the driver's marker {hidden}/.storage-check/" in out["hidden"]
    assert f"cannot see model.cache_dir = {hidden}" in out["hidden"]
    print(f"[two-hosts] storage check on a folder B cannot see:\n{out['hidden']}")
