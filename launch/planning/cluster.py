"""`ClusterInfo`: how the run reaches Ray, and what the cluster has, node by node.

Which Ray (the order of `ray.init`'s own look-up in Ray 2.60, `get_ray_address_from_environment`):

  1. `--ray-address HOST:PORT` (config `ray_address`); `auto` means "2 or 3, and an error when neither";
  2. the `RAY_ADDRESS` environment variable, when set and not empty;
  3. a cluster `ray start` left running on this machine: Ray writes its address to
     `<temp>/ray/ray_current_cluster` (temp = `RAY_TMPDIR`, else `TMPDIR`, else `/tmp`) and `ray stop`
     removes the file.

With one of them the run *joins* that cluster (`ray.init(address=...)`): a cluster run, whose services
advertise the node IPs Ray reports. With none it is a *single machine*: the run starts its own local Ray
(`ray.init(address="local", num_cpus=...)` — "local" because `ray.init` would otherwise join a cluster
started in the meantime, and raises when given `num_cpus` then) and its services stay on loopback.
`--serial` runs no Ray at all and is a single machine too.

Token authentication (Ray 2.60): `ray start` turns it on when a token exists (`~/.ray/auth_token`), and
`ray.init` enables it for a cluster found through 3 only, never for an explicit address. The run joins
with the explicit address it found, so for 3 it enables token mode the way `ray.init` would (Ray's own
`maybe_enable_token_auth_if_token_available`: `RAY_AUTH_MODE=token` in this process's environment, which
the run's processes inherit). For 1 and 2 it is Ray's rule: a cluster with token authentication needs
`RAY_AUTH_MODE=token` (and the cluster's token) in the environment of `algo-train`.

Deviations from Ray: for `auto` Ray also falls back to any GCS process `ps` shows; here only the
address file counts (a GCS without it is another user's private Ray, not a cluster to join).

`ClusterInfo.discover` joins briefly to read `ray.nodes()` (the resource check runs before anything
starts, in the `algo-train` process) and leaves again; `ClusterInfo.resolve(cfg)` returns the config the
run uses and records: "auto" settings decided (`launch.planning.resources.resolve_auto`) and `ray_address` set to
the cluster joined, so that `joins_cluster(cfg)` answers "does this run span a cluster" everywhere.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from configs.schema import RunConfig
from launch.planning.resources import Node, ResourceError, local_node, resolve_auto

_RAY_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
RAY_INIT = {"include_dashboard": False, "logging_level": "WARNING"}


def ray_address_file(environ: Mapping[str, str]) -> Path:
    """Where `ray start` records the address of the cluster it started on this machine."""
    tmp = environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp"
    return Path(tmp) / "ray" / "ray_current_cluster"


def find_cluster(flag: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """(address to join or None for a single machine, where it came from) — the order of the module
    docstring. Raises `ResourceError` for `auto` when no cluster is found."""
    if flag and flag != "auto":
        return flag, "--ray-address"
    if environ.get("RAY_ADDRESS"):
        return environ["RAY_ADDRESS"], "RAY_ADDRESS"
    path = ray_address_file(environ)
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip(), f"the local `ray start` cluster ({path})"
    if flag == "auto":
        raise ResourceError(f"--ray-address auto: no Ray cluster found (RAY_ADDRESS is not set and {path} does not "
                            "exist) — start one with `ray start --head`, or pass --ray-address HOST:PORT")
    return None, "this machine"


def nodes_from_ray(ray_nodes: list[dict]) -> list[Node]:
    """`ray.nodes()` -> one `Node` per live node, named by its IP; custom resources are every resource
    but CPU, GPU, memory, object store and Ray's own `node:<ip>` markers."""
    out = []
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        custom = {k: float(v) for k, v in res.items() if k not in _RAY_RESOURCES and not k.startswith("node:")}
        out.append(Node(n.get("NodeManagerAddress", "?"), float(res.get("CPU", 0)), float(res.get("GPU", 0)),
                        float(res.get("memory", 0)) / 2**30, custom))
    return sorted(out, key=lambda node: node.name)


def probe(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at `address` (host:port of a Ray GCS), or None when something accepts a TCP
    connection there. `ray.init` would retry an unreachable address for minutes; this takes seconds.
    Addresses with a scheme (ray://, Ray Client) are not probed."""
    if "://" in address:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not HOST:PORT"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        return f"nothing answers at {address} ({e.strerror or type(e).__name__})"
    return None


def cluster_nodes() -> list[Node]:
    """The live nodes of the Ray this process is connected to."""
    import ray

    return nodes_from_ray(ray.nodes())


def joins_cluster(cfg: RunConfig) -> bool:
    """True when the run spans a joined Ray cluster: its services listen on and advertise the node IPs
    Ray reports. False on a single machine (a local Ray, or --serial): they stay on loopback. Decided at
    launch: `ClusterInfo.resolve` sets `ray_address` to the cluster joined, None for a single machine."""
    return cfg.ray_address is not None


def init_ray(cfg: RunConfig) -> None:
    """Connect this process to the run's Ray: join `cfg.ray_address`, or start a local one (single machine)."""
    import ray

    if ray.is_initialized():
        return
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, log_to_driver=True, **RAY_INIT)
    else:
        private_ray_token(os.environ)
        start_local_ray(lambda: ray.init(address="local", num_cpus=max(1, len(os.sched_getaffinity(0))),
                                         log_to_driver=True, **RAY_INIT), ray.shutdown)


def start_local_ray(start, stop, tries: int = 2) -> None:
    """`start()` a local Ray; on a machine too busy for it (Ray 2.60 gives its raylet a fixed 30 s to register
    with the GCS, then raises "The current node timed out during startup") `stop()` and try again, `tries`
    in all, then stop the run with one line saying so (no Ray traceback)."""
    for attempt in range(1, tries + 1):
        try:
            start()
            return
        except Exception as e:  # Ray raises a bare Exception for the timeout
            if "timed out during startup" not in str(e):
                raise
            stop()
            if attempt == tries:
                raise ResourceError(f"the local Ray did not start: its raylet did not register within Ray's 30 s, "
                                   f"{tries} times (the machine is overloaded?); retry when it is less busy") from None


def private_ray_token(environ: MutableMapping[str, str]) -> Path | None:
    """A token of its own for the local Ray a one-machine run starts. Ray's GCS, raylet and workers
    listen on every interface whatever address they are given (Ray 2.60 turns 127.0.0.1 into the
    machine's network address), so only token authentication keeps others who reach this machine from
    using the run's Ray. Ray 2.60 turns it on for a new local cluster unless `RAY_AUTH_MODE` says
    otherwise, with the user's shared `~/.ray/auth_token` (created world-readable when missing). Unless
    the user chose a token (`RAY_AUTH_TOKEN` / `RAY_AUTH_TOKEN_PATH`) or a mode (`RAY_AUTH_MODE`, kept
    as set: `disabled` leaves Ray open), the run's Ray gets a fresh random token in a private file
    (0600, in a 0700 folder under the temp dir, removed at exit), named by `RAY_AUTH_TOKEN_PATH` in this
    process's environment, which every process of the local Ray inherits. Returns the file (None when
    the user's settings were kept)."""
    if environ.get("RAY_AUTH_MODE") or environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="impala-ray-"))  # 0700
    path = folder / "auth_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return path


@dataclass(frozen=True)
class ClusterInfo:
    """address: the Ray cluster joined (None = a single machine); source: where that came from;
    nodes: what each live node has; driver: the node this process runs on."""

    address: str | None
    source: str
    nodes: tuple[Node, ...]
    driver: str | None = None  # the node this process runs on, by its IP (None: the only node)

    @property
    def cluster(self) -> bool:
        """True when the run spans a joined Ray cluster (services must listen beyond loopback)."""
        return self.address is not None

    @classmethod
    def discover(cls, ray_address: str | None, serial: bool = False,
                 environ: Mapping[str, str] | None = None) -> ClusterInfo:
        """Find the cluster (module docstring) and read its nodes; a single machine is `local_node()`."""
        if serial:
            return cls(None, "--serial: learner and actors in this process", (local_node(),))
        env = os.environ if environ is None else environ
        address, source = find_cluster(ray_address, env)
        if address is None:
            return cls(None, "a local Ray", (local_node(),))
        local = source.startswith("the local")
        hint = f"; if no cluster runs any more, `ray stop` removes {ray_address_file(env)}" if local else ""
        why = probe(address)
        if why is not None:
            raise ResourceError(f"cannot join the Ray cluster at {address} (from {source}): {why}{hint}")
        import ray

        if local:
            from ray._private.authentication.authentication_token_setup import (
                maybe_enable_token_auth_if_token_available,
            )

            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        elif not env.get("RAY_AUTH_MODE"):
            hint = ("; a cluster with token authentication (on by default since Ray 2.60 when ~/.ray/auth_token "
                    "exists) also needs RAY_AUTH_MODE=token and the cluster's token here")
        try:
            ray.init(address=address, log_to_driver=False, **RAY_INIT)
            nodes, driver = cluster_nodes(), ray.util.get_node_ip_address()
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ResourceError(f"cannot join the Ray cluster at {address} (from {source}): {e}{hint}") from e
        finally:
            ray.shutdown()
        return cls(address, source, tuple(nodes), driver)

    def resolve(self, cfg: RunConfig) -> RunConfig:
        """The run's config on this cluster: "auto" settings decided, `ray_address` = the cluster joined."""
        out = resolve_auto(cfg, self.nodes)
        out.ray_address = self.address
        return out

    def describe(self) -> str:
        if not self.cluster:
            return f"this machine ({self.source}): {self.nodes[0].figures()}"
        return f"Ray cluster at {self.address} ({self.source}): " + "; ".join(n.describe() for n in self.nodes)
