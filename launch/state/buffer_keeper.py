"""The run's buffer service process: started, snapshotted, and restarted when it dies.

The driver owns the buffer (a spawned child of the driver's process, `buffer.process`). Its state is
written to `run_dir/buffer/snapshot.msgpack` every `buffer.snapshot_every_s` and into every checkpoint;
the keeper remembers the latest of these and when it was taken.

When the process dies, `restart` starts a new one on the same address (same port, same CURVE keys), so
the actors' links reconnect by themselves and re-push every group the dead one had not acknowledged.
Before it serves anyone the new process loads the latest snapshot minus the groups trained since
(`exclude`, the ledger's keys): those were pulled after the snapshot and must not be served again.

What the snapshot cannot hold: groups the dead buffer acknowledged after it was taken and the learner
never pulled. Their prompts are found with `lost_prompts` and generated again by their actors:

    lost = delivered since the snapshot  -  trained  -  held by the new buffer

"delivered since" is each actor's record of acknowledged groups (`AsyncActor.delivered_since`), read
*before* what the new buffer holds, so a group re-pushed to the new buffer in between is seen as held,
never as lost. A group the dead buffer dropped (stale, filtered) is also in `lost`: its prompt is
generated once more, which costs a rollout but can neither lose a prompt nor train one twice.

The process writes its output (warnings of the service, e.g. a reply to an actor that died) to
run_dir/logs/buffer.log, not to the terminal (`start_buffer_process(log_path=...)`; logging.verbose keeps the
terminal).

Counters the run writes stay monotonic across restarts (`monotonic`): a restored buffer goes on from its
snapshot's counts (and its handshake counters from 0), so the keeper carries, per counter, what each
dead incarnation had counted past that point as last seen, and adds it to what the live one reports.
Events of the dead buffer after the driver last read its stats are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from buffer.records import Key


def lost_prompts(delivered: Iterable, settled: Iterable, held: Iterable) -> list[Key]:
    """Keys delivered to a dead buffer that were neither settled (trained or discarded, per the ledger)
    nor are held by its successor, in the order delivered (see the module docstring)."""
    gone = {tuple(k) for k in settled} | {tuple(k) for k in held}
    out, seen = [], set()
    for k in map(tuple, delivered):
        if k not in gone and k not in seen:
            seen.add(k)
            out.append((int(k[0]), int(k[1])))
    return out


class BufferKeeper:
    """Starts the buffer service and restarts it from the latest snapshot when it died.

    ``cfg``: the run config; ``advertise_host``: the driver node's IP on a cluster (None on one
    machine); ``secrets``: the run's full ``RunSecrets``; ``run_dir``: where timer snapshots and the
    process's log (``log_path``; None with logging.verbose: the terminal) go."""

    def __init__(self, cfg, run_dir: Path, *, advertise_host: str | None = None, secrets=None):
        self.cfg, self.advertise_host, self.secrets = cfg, advertise_host, secrets
        self.snapshot_path = run_dir / "buffer" / "snapshot.msgpack"
        self.run_dir = run_dir
        self.proc = None
        self.address: str | None = None
        self.restarts = 0
        self.latest: tuple[Path, float] | None = None  # (snapshot, wall time just before it was taken)
        self._last_timer = time.monotonic()
        self.carried: dict[str, int] = {}  # counter -> counted by the dead incarnations (`monotonic`)
        self._seen: dict[str, int] = {}  # the live incarnation's counters as last read

    def start(self, restore: tuple[str, list] | None = None) -> str:
        from buffer.process import start_buffer_process

        port = {} if self.address is None else {"port": int(self.address.rsplit(":", 1)[1])}
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc, address = start_buffer_process(self.cfg, advertise_host=self.advertise_host, secrets=self.secrets,
                                                  restore=restore, log_path=self.log_path and str(self.log_path),
                                                  **port)
        if self.address is not None and address != self.address:
            raise RuntimeError(f"the restarted buffer serves at {address}, not at {self.address}")
        self.address = address
        return address

    @property
    def log_path(self) -> Path | None:
        return None if self.cfg.logging.verbose else self.run_dir / "logs" / "buffer.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def death(self) -> str | None:
        """Why the buffer process is gone (None while it runs)."""
        if self.proc is None or self.proc.is_alive():
            return None
        return f"exit code {self.proc.exitcode}"

    def taken(self, path: Path, wall_time: float) -> None:
        """Record a snapshot written to `path` (a checkpoint's), begun at `wall_time` (time.time())."""
        self.latest = (Path(path), wall_time)

    def maybe_snapshot(self, client) -> bool:
        """Take the timer's snapshot through `client` when `buffer.snapshot_every_s` has passed since
        the last one (never when it is 0); True when one was taken."""
        every = self.cfg.buffer.snapshot_every_s
        if not every or time.monotonic() - self._last_timer < every:
            return False
        began = time.time()
        client.snapshot(str(self.snapshot_path))
        self._last_timer = time.monotonic()
        self.taken(self.snapshot_path, began)
        return True

    def restart(self, trained: Iterable) -> dict:
        """Start a new buffer process at the same address from the latest snapshot, without the groups
        of `trained` keys. Returns {"snapshot", "since", "restored": {version, groups, excluded, demos}}
        ("snapshot" None: there was none yet, the new buffer starts empty)."""
        if self.proc is not None:
            self.proc.join(timeout=5)
        restore = None if self.latest is None else (str(self.latest[0]), [list(k) for k in trained])
        self.start(restore)
        self.restarts += 1
        base = (self.proc.restored or {}).get("counts", {})
        for k, v in self._seen.items():  # handshake counters start from 0, the others from the snapshot
            self.carried[k] = self.carried.get(k, 0) + v - (0 if k.startswith("auth/") else base.get(k, 0))
        self._seen = {}
        return {"snapshot": None if self.latest is None else str(self.latest[0]),
                "since": 0.0 if self.latest is None else self.latest[1], "restored": self.proc.restored}

    def monotonic(self, stats: dict) -> dict:
        """`stats` of the live buffer with the counters the run writes carried over its restarts (module
        docstring): dropped_stale, generated_samples / generated_correct, filtered/<reason>, auth refused /
        refused_peers."""
        out = {**stats, "filtered": dict(stats.get("filtered", {})), "auth": dict(stats.get("auth", {}))}
        flat = {"dropped_stale": (out, "dropped_stale"), "generated_samples": (out, "generated_samples"),
                "generated_correct": (out, "generated_correct"), "auth/refused": (out["auth"], "refused"),
                "auth/refused_peers": (out["auth"], "refused_peers"),
                **{f"filtered/{r}": (out["filtered"], r) for r in out["filtered"]}}
        self._seen = {k: int(d.get(key, 0)) for k, (d, key) in flat.items()}
        for k, n in self.carried.items():
            d, key = flat.get(k) or (out["filtered"], k.split("/", 1)[1])  # a filter reason the new one has not seen
            d[key] = d.get(key, 0) + n
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join(timeout=10)
