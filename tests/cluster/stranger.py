"""A stranger in a second network namespace against a one-machine run (issue 23 item 1), used by the
Ctrl-C end-to-end run (`tests/e2e/test_train_e2e.py`), which runs two learner ranks and two actors: every
service a one-machine run opens is up there, and the probe costs that run ~25 s instead of a run of its own.

Namespace S is joined to this machine's own namespace by a veth pair (this side 198.18.3.1, S
198.18.3.2, S routes everything through it), so from S every address of this machine is "the
network". While the run goes, every TCP socket its processes listen on is sampled (`ss -ltnp` for the
run's process tree, `Stranger.sample`); once it trains, the stranger in S dials each of them at every
address of this machine (`Stranger.probe`) and sends what a client of the run's services would send (a
TCPStore `list_keys`), an HTTP/2 preface (what a gRPC server answers) and an HTTP request.

What it shows (`Stranger.check`): the run's own services (buffer, learner rendezvous store, weight-sync
store, gloo, vLLM's sockets) listen on loopback only, so the stranger cannot even connect; what does
answer from S is Ray's (its gRPC servers and agents listen on every interface whatever address they are
given), and the run's local Ray has a token the stranger does not hold: its `ray.init` to the run's GCS
is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import netns

HERE, THERE = "198.18.3.1", "198.18.3.2"

# From S: dial HOST:PORT for each argv; record what each answers. Prints {target: outcome}.
PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor

def dial(target):
    host, port = target.rsplit(":", 1)
    try:
        c = socket.create_connection((host, int(port)), timeout=5)
    except OSError as e:
        return "refused: " + type(e).__name__
    c.settimeout(3)
    try:
        c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        head = c.recv(9)
    except OSError:
        head = b""
    c.close()
    if len(head) >= 4 and head[3] == 4:
        return "grpc"  # a SETTINGS frame: an HTTP/2 (gRPC) server, i.e. Ray's
    try:
        with socket.create_connection((host, int(port)), timeout=5) as c:
            c.settimeout(3)
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return "http: " + c.recv(64).decode(errors="replace").splitlines()[0][:40]
    except (OSError, IndexError):
        return "accepted, no answer"

targets = sys.argv[1:]
with ThreadPoolExecutor(32) as pool:  # all at once: an answering port costs up to ~11 s of timeouts
    print(json.dumps(dict(zip(targets, pool.map(dial, targets)))))
"""

# From S: join the run's Ray without its token (no RAY_AUTH_* in the environment, an empty HOME); Ray
# may keep retrying a refused connection, so 20 s without joining counts as refused (a joinable GCS answers
# ray.init within seconds on this machine).
JOIN_RAY = """
import signal, sys
def give_up(*_):
    print("NOT JOINED within 20 s (ray.init kept retrying)", flush=True)
    raise SystemExit(0)
signal.signal(signal.SIGALRM, give_up)
signal.alarm(20)
import ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    print("JOINED", ray.cluster_resources())
except Exception as e:
    print("REFUSED", type(e).__name__, str(e)[:200])
"""


def tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for line in subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += children.get(p, [])
    return out


def listeners(pids: set[int]) -> dict[tuple[str, int], str]:
    """(address, port) -> process name, for every TCP listener of `pids`."""
    out = {}
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines():
        found = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        names = [name for name, pid in found if int(pid) in pids]
        if names:
            addr, _, port = line.split()[3].rpartition(":")
            out[(addr.strip("[]"), int(port))] = names[0]
    return out


def my_addresses() -> list[str]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    return [a["local"] for link in json.loads(out) for a in link.get("addr_info", []) if a["local"] != "127.0.0.1"]


RAY_NAMES = ("gcs_server", "raylet", "ray::", "python")  # `python`: Ray's agents and the driver's core worker


def stranger_env() -> dict[str, str]:
    """The environment of a default run: none of the interface or Ray-auth settings a user may add."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "GLOO_SOCKET", "NCCL_SOCKET"))}


@dataclass
class Stranger:
    """The stranger's namespace `ns` and what it found of the run whose launcher is `run_pid`."""

    ns: str
    run_pid: int
    seen: dict[tuple[str, int], str] = field(default_factory=dict)  # (address, port) -> process name
    probed: dict[str, str] = field(default_factory=dict)  # "host:port" -> what answered from S
    ray_join: str = ""

    def sample(self) -> None:
        self.seen |= listeners(tree(self.run_pid))

    def probe(self, home: Path) -> None:
        """Dial every port seen at every address of this machine, then join the run's Ray without its token
        (`home`: an empty folder, so no token file is found either)."""
        self.sample()
        targets = [f"{host}:{port}" for _, port in self.seen for host in my_addresses()]
        res = subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", PROBE, *targets],
                             capture_output=True, text=True, timeout=300)
        self.probed = json.loads(res.stdout.strip().splitlines()[-1])
        gcs = [port for (_, port), name in self.seen.items() if name == "gcs_server"]
        home.mkdir(exist_ok=True)
        res = subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", JOIN_RAY,
                              f"{my_addresses()[0]}:{gcs[0]}"], capture_output=True, text=True,
                             timeout=120, env=stranger_env() | {"HOME": str(home)})
        self.ray_join = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-300:]

    def check(self) -> None:
        print("[stranger] listeners of the run:\n"
              + "\n".join(f"  {a}:{p} {n}" for (a, p), n in sorted(self.seen.items())))
        print("[stranger] from the other namespace:\n"
              + "\n".join(f"  {t}: {o}" for t, o in sorted(self.probed.items())))
        print(f"[stranger] ray.init without the run's token: {self.ray_join}")
        assert self.probed, "the stranger never probed the run"
        wide = {(a, p): n for (a, p), n in self.seen.items() if a not in ("127.0.0.1", "::1")}
        # whatever listens beyond loopback is Ray's: its gRPC servers, or its agents' HTTP
        answered = {t: o for t, o in self.probed.items() if not o.startswith("refused")}
        assert all(o == "grpc" or o.startswith("http") for o in answered.values()), answered
        assert all(n.startswith(RAY_NAMES) for n in wide.values()), wide
        # the run's own services answer nothing from S: every port listening on loopback only is refused there
        loopback_ports = {p for (a, p) in self.seen if a == "127.0.0.1"} - {p for (_, p) in wide}
        assert loopback_ports and all(self.probed[f"{h}:{p}"].startswith("refused") for p in loopback_ports
                                      for h in my_addresses())
        assert self.ray_join.startswith(("REFUSED", "NOT JOINED")), self.ray_join


@contextlib.contextmanager
def stranger_namespace() -> Iterator[str | None]:
    """A namespace S routed to this machine through a veth pair; None where namespaces cannot be made."""
    if netns.unavailable():
        yield None
        return
    tag = f"{os.getpid() % 100000}"
    ns, here, there = f"c9s-{tag}", f"v9h{tag}"[:15], f"v9s{tag}"[:15]
    _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _sh("ip", "link", "set", there, "netns", ns)
        _sh("ip", "addr", "add", f"{HERE}/24", "dev", here)
        _sh("ip", "link", "set", here, "up")
        _sh("ip", "-n", ns, "addr", "add", f"{THERE}/24", "dev", there)
        _sh("ip", "-n", ns, "link", "set", there, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns, "route", "add", "default", "via", HERE)
        yield ns
    finally:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)
