"""Two hosts on one machine: network namespaces A and B joined by a veth pair, a Ray head on A and a
Ray worker on B — a real two-node Ray cluster whose nodes only reach each other over the wire.

    A: 198.18.0.1/24 ──veth── B: 198.18.0.2/24        (+ each its own loopback, up)

198.18.0.0/15 is the benchmarking range (RFC 2544): never routed, and not this machine's own network
(192.0.2.0/24), so nothing can leave the namespaces: they have no other interface and no route. Each
namespace has its own loopback, so 127.0.0.1 in B is B's own — a process on B that dials 127.0.0.1
for a service of A finds nothing, exactly as on two machines. What the namespaces share is what a
cluster with a shared filesystem shares: files (the run folder, the model cache), users, the Python
environment. One thing B does not share: `hidden_on_b`, a folder covered on B by a private tmpfs (a
disk only A has), for the shared-storage check.

Ray runs with token authentication on every node and every driver: RAY_AUTH_MODE=token and a token
file of the harness's own (RAY_AUTH_TOKEN_PATH), in the environment of the head, of the worker and of
every command run through `TwoHosts.run`/`popen` (`TwoHosts.env`). Ray 2.60 turns it on by itself only
for a head started where ~/.ray/auth_token exists — never for a joining worker nor for
`ray.init(address=...)` — so a real cluster sets it on every node too (docs/running.md). Nothing else is
set: no GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, although the machine's hostname resolves to 127.0.0.1
here (what gloo binds by default). A run must not need them where its learner ranks share a node: the
weight sync binds the addresses it advertises, and a learner of one rank makes no rendezvous. (With
the variable exported, a run that set it to loopback in the learner's process passed here while it
failed for users: review gpu_path_2 N1.)

Everything started here is stopped by pid in `close()`: every process living in either namespace
(`ip netns pids`), then the namespaces themselves (which takes the veth pair with them).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

IP = {"A": "198.18.0.1", "B": "198.18.0.2"}
PREFIX = 24
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 256 << 20  # per node; the default (30% of RAM, twice on one machine) is far too much

# Prints the alive nodes of the cluster once there are `want` of them (or the deadline passed).
WAIT_FOR_NODES = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
want, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps([{"ip": n["NodeManagerAddress"], "node_id": n["NodeID"], "resources": n["Resources"]}
                  for n in nodes]))
"""


def unavailable() -> str | None:
    """Why two namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); run the suite as root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    name = f"c9probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@dataclass
class TwoHosts:
    tag: str  # unique per harness: several may run on one machine at once
    root: Path  # the harness's own folder: Ray temp dirs, logs, the Ray token
    ray_port: int
    env: dict[str, str]  # environment of everything started in the namespaces (Ray token auth)
    hidden_on_b: Path
    nodes: list[dict] = field(default_factory=list)  # [{"ip", "node_id", "resources"}] as Ray reports them
    procs: list[subprocess.Popen] = field(default_factory=list)
    startup_s: float = 0.0

    @property
    def head_address(self) -> str:
        return f"{IP['A']}:{self.ray_port}"

    def ns(self, host: str) -> str:
        return f"c9{host.lower()}-{self.tag}"

    def veth(self, host: str) -> str:
        return f"v9{host.lower()}{self.tag}"[:15]

    def argv(self, host: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def env_of(self, host: str) -> dict[str, str]:
        """The environment of what runs on `host`: `env` (Ray's token auth), nothing host-specific."""
        return dict(self.env)

    def run(self, host: str, *argv: str, timeout: float = 120, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run `argv` in `host` from the repository root; its output captured."""
        proc = subprocess.run(self.argv(host, *argv), capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=env or self.env_of(host))
        if check and proc.returncode != 0:
            raise RuntimeError(f"on host {host}: {' '.join(argv)[:300]} exited {proc.returncode}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return proc

    def python(self, host: str, code: str, *args: str, timeout: float = 120, check: bool = True):
        return self.run(host, sys.executable, "-c", code, *args, timeout=timeout, check=check)

    def popen(self, host: str, *argv: str, log: Path | None = None, env: dict | None = None,
              **kwargs) -> subprocess.Popen:
        """Start `argv` in `host` (a session of its own; stdout+stderr to `log`, else piped; environment
        `env_of(host)` unless given). `close()` stops it."""
        out = open(log, "ab") if log else subprocess.PIPE  # noqa: SIM115 (the child holds it)
        try:
            proc = subprocess.Popen(self.argv(host, *argv), stdout=out, stderr=subprocess.STDOUT if log else None,
                                    cwd=REPO, env=env or self.env_of(host), start_new_session=True, **kwargs)
        finally:
            if log:
                out.close()
        self.procs.append(proc)
        return proc

    def listening(self, host: str) -> set[tuple[str, int]]:
        """(address, port) of every TCP socket listening in `host`."""
        out = self.run(host, "ss", "-tlnH", timeout=30).stdout
        found = set()
        for line in out.splitlines():
            local = line.split()[3]
            addr, _, port = local.rpartition(":")
            found.add((addr.strip("[]"), int(port)))
        return found

    def veth_bytes(self, host: str) -> dict[str, int]:
        """{"rx", "tx"}: bytes `host`'s end of the veth pair has received and sent."""
        (link,) = json.loads(subprocess.run(["ip", "-n", self.ns(host), "-j", "-s", "link", "show", "dev",
                                             self.veth(host)], capture_output=True, text=True, check=True).stdout)
        return {"rx": link["stats64"]["rx"]["bytes"], "tx": link["stats64"]["tx"]["bytes"]}

    def pids(self, host: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns(host)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def close(self) -> None:
        """Stop everything that runs in either namespace (by pid), then delete the namespaces."""
        for proc in self.procs:  # `ray start --block` stops its node's processes on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)
        for _ in range(5):  # whatever is left (Ray workers, engines, a run) is killed by pid
            left = [pid for host in "AB" for pid in self.pids(host)]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for host in "AB":
            subprocess.run(["ip", "netns", "del", self.ns(host)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        """The tail of the Ray nodes' own logs (for a failure message)."""
        parts = []
        for name in ("head.log", "worker.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _sh(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def _make_network(h: TwoHosts) -> None:
    for host in "AB":
        _sh("ip", "netns", "add", h.ns(host))
    _sh("ip", "link", "add", h.veth("A"), "type", "veth", "peer", "name", h.veth("B"))
    for host in "AB":
        ns, dev = h.ns(host), h.veth(host)
        _sh("ip", "link", "set", dev, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"{IP[host]}/{PREFIX}", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")


def _ray_start(h: TwoHosts, host: str, cpus: int, resources: dict, extra: list[str]) -> subprocess.Popen:
    temp = h.root / host.lower()  # short: Ray's unix socket paths must stay under 108 characters
    argv = [RAY, "start", "--block", "--node-ip-address", IP[host], "--temp-dir", str(temp),
            "--num-cpus", str(cpus), "--resources", json.dumps(resources),
            "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats", *extra]
    if host == "B":  # a folder B cannot see: a tmpfs over it in B's own mount namespace (ip netns exec
        # gives every command one, slave to the machine's, so the mount stays inside)
        argv = ["sh", "-c", f"mount -t tmpfs -o size=1m hidden-on-b {h.hidden_on_b} && exec \"$@\"", "sh", *argv]
    return h.popen(host, *argv, log=h.root / ("head.log" if host == "A" else "worker.log"))


def start(cpus: dict[str, int] | None = None, timeout_s: float = 180) -> TwoHosts:
    """Build the namespaces, start the Ray head on A and the worker on B, and wait until Ray reports
    both nodes alive. Each host carries a custom resource named after it ({"hostA": 100} on A,
    {"hostB": 100} on B) to place roles by host. Raises (after cleaning up) if the cluster does not form."""
    cpus = cpus or {"A": 3, "B": 2}
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="c9-", dir="/tmp"))
    token = root / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    hidden = root / "hidden-on-b"
    hidden.mkdir()
    h = TwoHosts(tag=f"{os.getpid() % 100000}{random.randrange(100):02d}", root=root,
                 ray_port=random.randrange(20000, 30000), env=env, hidden_on_b=hidden)
    try:
        _make_network(h)
        _ray_start(h, "A", cpus["A"], {"hostA": 100},
                   ["--head", "--port", str(h.ray_port), "--include-dashboard", "false"])
        h.run("A", "timeout", str(int(timeout_s)), "bash", "-c",
              f"until (exec 3<>/dev/tcp/{IP['A']}/{h.ray_port}) 2>/dev/null; do sleep 0.1; done",
              timeout=timeout_s + 5)
        _ray_start(h, "B", cpus["B"], {"hostB": 100}, ["--address", h.head_address])
        out = h.python("A", WAIT_FOR_NODES, h.head_address, "2", str(timeout_s), timeout=timeout_s + 60)
        h.nodes = json.loads(out.stdout.strip().splitlines()[-1])
        if len(h.nodes) != 2:
            raise RuntimeError(f"the two-host Ray cluster did not form within {timeout_s:.0f} s: nodes {h.nodes}")
        h.startup_s = time.monotonic() - t0
        return h
    except BaseException as e:
        logs = h.logs()
        h.close()
        if isinstance(e, Exception):
            raise RuntimeError(f"two-host harness failed to start: {e}\n{logs}") from e
        raise
