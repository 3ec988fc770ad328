"""Two hosts, for real: `algo-train --algo grpo` driven from host A (driver, buffer, learner) with its
vLLM actors on host B (`tests.cluster.netns`: two network namespaces, a Ray head on A, a Ray worker on
B, joined by a veth pair), for a few steps.

What is checked, and how it is observed:
- the run trains and finishes: metrics rows for every step, a checkpoint, every weight push
  acknowledged (`time/weight_sync_s` in each row);
- the roles sit where they were placed: `ray::ActorRole` processes live in B's namespace, every
  `ray::LearnerRank` in A's (sampled from `ip netns pids` during the run);
- the traffic crosses the veth: B dialled the buffer at A's address (SYNs out of B's veth), and B's
  end of the veth received at least one full copy of the weights per push (interface counters);
- no process on B ever dialled a loopback address for a service of A: a packet watch in B records every
  SYN and RST (`tests.cluster.tcpwatch`); a dial of 127.0.0.1:p refused with a reset, or any loopback
  dial of a port that A listened on and B did not, is what a service advertised on loopback looks like
  (the "Connection refused, remote=[127.0.0.1]" of the issue). Listening ports of both hosts are
  sampled every half second during the run;
- a stranger process on B without the run's keys gets nothing served and nothing accepted: its calls
  to the buffer time out, its group (prompt STRANGER_PROMPT) never reaches the prompt ledger, and the
  buffer counts the refused handshakes (summary.json `buffer.auth.refused`).

The runs log the addresses they use; the test prints those lines.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.cluster.netns import IP, TwoHosts
from tests.cluster.tcpwatch import refused_loopback
from tests.e2e.helpers import check_run, command, descendants, ledger

pytestmark = pytest.mark.slow

# How the run places its roles by host (the custom resources the harness gives each node).
ACTORS_ON_B = 'rollout.custom_resources={"hostB": 1}'
LEARNER_ON_A = 'learner.custom_resources={"hostA": 1}'
STEPS = 3
ACTORS = 2
STRANGER_PROMPT = 987654  # far beyond the run's prompts: it would show in the ledger if accepted
RUN_TIMEOUT_S = 540
# The plumbing is under test, not learning: the tiny model without its SFT warm-up builds in seconds
# (the warm-up takes ~30 s unloaded, minutes on a busy machine). Its answers are nearly all wrong (the
# advantages mostly 0), but every step still trains, checkpoints and pushes the full weights.
UNTRAINED_MODEL = ["--set", "model.sft_warmup_steps=0"]

# A client without the run's keys, on B: the buffer's own client with no keys, then with another
# run's keys; each call must go unanswered. Prints {"<keys>: <call>": outcome}.
STRANGER = """
import json, sys
from buffer.auth import RunSecrets
from buffer.client import BufferClient, BufferUnavailable
from tests.buffer.helpers import make_group
out = {}
for name, secrets in (("no keys", None), ("another run's keys", RunSecrets.generate().public())):
    client = BufferClient(sys.argv[1], "stranger-" + str(len(out)), timeout_s=3.0, secrets=secrets)
    calls = {"stats": client.stats,
             "push_group": lambda: client.push_group(make_group("stranger-0", prompt_index=int(sys.argv[2])))}
    for call, fn in calls.items():
        try:
            out[f"{name}: {call}"] = "answered: " + repr(fn())[:200]
        except BufferUnavailable as e:
            out[f"{name}: {call}"] = type(e).__name__
    client.close()
print(json.dumps(out))
"""


def role_pids(hosts: TwoHosts, host: str, role: str) -> set[int]:
    """Pids in `host`'s namespace whose process title is Ray's for `role` (`ray::ActorRole...`)."""
    found = set()
    for pid in hosts.pids(host):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(f"ray::{role}"):
            found.add(pid)
    return found


class Observer:
    """Samples, every half second while the run lives: the listening ports of A and B, which role
    processes live on which host, and the buffer's port (the listening socket of the driver's
    spawned buffer process); starts the stranger on B once the buffer listens."""

    def __init__(self, hosts: TwoHosts, run_pid: int, stranger_log: Path):
        self.hosts, self.run_pid, self.stranger_log = hosts, run_pid, stranger_log
        self.listening = {"A": set(), "B": set()}
        self.roles = {(h, r): set() for h in "AB" for r in ("ActorRole", "LearnerRank")}
        self.buffer_port: int | None = None
        self.stranger: subprocess.Popen | None = None
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _buffer_port(self) -> int | None:
        spawned = {pid for pid, args in descendants(self.run_pid) if "multiprocessing" in args}
        out = self.hosts.run("A", "ss", "-tlnpH", timeout=30).stdout
        for line in out.splitlines():
            pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
            if pids & spawned:
                return int(line.split()[3].rpartition(":")[2])
        return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for host in "AB":
                    self.listening[host] |= self.hosts.listening(host)
                    for role in ("ActorRole", "LearnerRank"):
                        self.roles[host, role] |= role_pids(self.hosts, host, role)
                if self.buffer_port is None:
                    self.buffer_port = self._buffer_port()
                    if self.buffer_port is not None:
                        self.stranger = self.hosts.popen(
                            "B", sys.executable, "-c", STRANGER, f"tcp://{IP['A']}:{self.buffer_port}",
                            str(STRANGER_PROMPT), log=self.stranger_log)
            except Exception as e:  # keep sampling; reported at the end
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def ports(self, host: str) -> set[int]:
        return {port for _, port in self.listening[host]}


def watch_tcp(hosts: TwoHosts, out: Path) -> subprocess.Popen:
    watch = hosts.popen("B", sys.executable, "-m", "tests.cluster.tcpwatch", str(out), text=True)
    assert watch.stdout.readline().strip() == "ready", "the TCP watch on B did not start"
    return watch


@pytest.mark.parametrize("world_size", [
    1,
    pytest.param(2, marks=pytest.mark.skipif(
        os.environ.get("IMPALA_TWO_HOSTS_RANKS2") != "1",
        reason="the 2-rank two-host run is opt-in (IMPALA_TWO_HOSTS_RANKS2=1): it adds ~3 min to the suite")),
])
def test_grpo_trains_across_two_hosts(two_hosts, model_cache, tmp_path, world_size):
    hosts = two_hosts
    out, log_path = tmp_path / "run", tmp_path / "run.log"
    watch = watch_tcp(hosts, tmp_path / "tcp-b.jsonl")
    veth_before = hosts.veth_bytes("B")
    argv = command(out, model_cache, "--algo", "grpo", "--actors", str(ACTORS), "--steps", str(STEPS),
                   "--max-staleness", "1", "--ray-address", hosts.head_address, "--set", ACTORS_ON_B,
                   "--set", LEARNER_ON_A, "--set", f"learner.world_size={world_size}", *UNTRAINED_MODEL)
    run = hosts.popen("A", *argv, log=log_path, env=hosts.env_of("A") | {"RAY_DEDUP_LOGS": "1"})
    observer = Observer(hosts, run.pid, tmp_path / "stranger.log")
    try:
        run.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGINT)
        run.wait(timeout=120)
    finally:
        observer.stop()
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=10)
    log = log_path.read_text(errors="replace")
    print("[two-hosts] the run's address lines:\n" + "\n".join(
        line for line in log.splitlines() if re.search(r"198\.18\.|address|listen", line)))
    assert run.returncode == 0, f"algo-train on two hosts failed ({run.returncode}):\n{log[-6000:]}"
    assert not observer.errors, observer.errors

    # the run: every step trained, every push acknowledged, a checkpoint written
    rows = check_run(out, STEPS, 1, "loss/pg")
    assert all(math.isfinite(r["time/weight_sync_s"]) and r["time/weight_sync_s"] > 0 for r in rows), rows
    weights = out / "hf" / f"step_{STEPS}" / "model.safetensors"  # the run's final HF export
    assert weights.is_file()

    # placement: actors on B, learner ranks on A, nowhere else
    roles = {key: len(pids) for key, pids in observer.roles.items()}
    assert roles[("B", "ActorRole")] >= ACTORS and roles[("A", "ActorRole")] == 0, roles
    assert roles[("A", "LearnerRank")] == world_size and roles[("B", "LearnerRank")] == 0, roles

    # across the veth: B dialled the buffer at A's address; B received ≥ one copy of the weights per push
    records = [json.loads(line) for line in (tmp_path / "tcp-b.jsonl").read_text().splitlines()]
    assert observer.buffer_port is not None, "the buffer's listening socket was never seen on A"
    dialled = {r["dport"] for r in records if r["if"] == hosts.veth("B") and r["out"] and r["flags"] == "S"
               and r["dst"] == IP["A"]}
    assert observer.buffer_port in dialled, (observer.buffer_port, dialled)
    received = hosts.veth_bytes("B")["rx"] - veth_before["rx"]
    assert received >= STEPS * weights.stat().st_size, (received, weights.stat().st_size)

    # loopback: nothing on B dialled 127.0.0.1 for a service of A
    a_ports, b_ports = observer.ports("A"), observer.ports("B")
    refused = refused_loopback(records)
    loopback_to_a = sorted({r["dport"] for r in records if r["flags"] == "S" and r["dst"].startswith("127.")
                            and r["dport"] in a_ports - b_ports})
    assert not [p for _, p in refused if p in a_ports], f"B dialled A's ports on loopback and was refused: {refused}"
    assert not loopback_to_a, f"B dialled loopback ports that only A listened on: {loopback_to_a}"
    print(f"[two-hosts] B: {len(dialled)} port(s) of A dialled across the veth, {received / 2**20:.1f} MiB "
          f"received; refused loopback dials on B: {refused or 'none'}")

    # the stranger: nothing served, nothing accepted, and the buffer counted it
    assert observer.stranger is not None and observer.stranger.wait(timeout=60) == 0, \
        (tmp_path / "stranger.log").read_text()
    outcome = json.loads((tmp_path / "stranger.log").read_text().strip().splitlines()[-1])
    # refused (BufferAuthError when the refused handshake was reported before the call's timeout)
    assert outcome and all(v in ("BufferAuthError", "BufferUnavailable") for v in outcome.values()), outcome
    assert STRANGER_PROMPT not in {p for _, p in ledger(out, STEPS)}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["buffer"]["auth"]["refused"] >= len(outcome) // 2, summary["buffer"]["auth"]
