"""Plain settings of the buffer service, built from the typed run config without importing it.

The buffer may import only zmq, msgpack, numpy and the standard library, so it reads `BufferConfig`
(and `LearnerConfig.batch_prompts`) by attribute or from a dict/JSON and keeps its own dataclass; the
extra knobs here (credit time-to-live, wire limits, dedup window) have defaults that need no config.

Where the service listens and what it tells clients are two things (`listen_hosts`): it *binds* an
interface of its own node and *advertises* an address other nodes can reach. `host` ("auto" or an IPv4
address, from `buffer.host`) chooses the first; `advertise_host` is not a config key but a fact the
launcher passes in: the serving node's IP as Ray reports it when the run spans several nodes, None when
it runs on one machine.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, fields

from buffer.checks import Limits

FILTERS = ("none", "extreme", "accuracy_window")
LOOPBACK = "127.0.0.1"  # the single-machine default: nothing outside this machine can connect
ALL_INTERFACES = "0.0.0.0"


def listen_hosts(host: str, advertise_host: str | None) -> tuple[str, str]:
    """(host to bind, host clients connect to) of the buffer service.

    host: `buffer.host`: "auto", or an IPv4 address (0.0.0.0 = every interface of this node).
    advertise_host: the serving node's IP as Ray reports it when the run spans several nodes; None = one
    machine.

        host       one machine (None)        cluster (node IP N)
        auto       127.0.0.1 -> 127.0.0.1    0.0.0.0 -> N
        0.0.0.0    0.0.0.0   -> 127.0.0.1    0.0.0.0 -> N
        A          A         -> A            A       -> A   (A: one interface, chosen by the user)
        127.x.y.z  127.x.y.z -> 127.x.y.z    ValueError (other nodes cannot reach a loopback address)
    """
    if advertise_host is not None and (not advertise_host or any(c in advertise_host for c in ":/ ")):
        raise ValueError(f"buffer advertise host {advertise_host!r}: need this node's IPv4 address or host name "
                         f"(IPv6 is not supported)")
    if host == "auto":
        return (LOOPBACK, LOOPBACK) if advertise_host is None else (ALL_INTERFACES, advertise_host)
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"buffer.host: {host!r} is neither 'auto' nor an IPv4 address; use auto (loopback on "
                         f"one machine, every interface on a cluster), 0.0.0.0 or one of this node's IPs") from None
    if ip.is_unspecified:
        return ALL_INTERFACES, advertise_host or LOOPBACK
    if ip.is_loopback and advertise_host is not None:
        raise ValueError(f"buffer.host: {host} listens on loopback only, but the run spans several nodes and actors "
                         f"elsewhere could not reach it; set buffer.host: auto (or 0.0.0.0, or this node's IP)")
    return host, host


# `buffer:` keys the launcher acts on; the service ignores them (auto: the driver raises K via set_version)
LAUNCHER_KEYS = {"snapshot_every_s", "max_staleness_auto", "max_staleness_cap"}


@dataclass
class BufferSettings:
    max_staleness: int = 1  # K, versions, at start (`BufferCore.max_staleness` holds the one in force)
    capacity_groups: int = 256  # groups stored + credited in flight
    filter: str = "none"
    acc_lo: float = 0.2
    acc_hi: float = 0.8
    max_message_mb: float = 64.0
    host: str = "auto"  # what to bind: see listen_hosts
    port: int = 0
    advertise_host: str | None = None  # the node IP on a cluster (set by the launcher); None = one machine
    batch_prompts: int = 8  # groups the learner consumes per version (LearnerConfig.batch_prompts)
    credit_ttl_s: float = 600.0  # credits of a client silent this long are reclaimed; 0 = never
    max_samples_per_group: int = 1024
    max_tokens_per_sample: int = 1 << 20
    max_demo_tokens: int = 1 << 28  # all stored demonstrations together
    dedup_window: int = 1 << 20  # group ids remembered for duplicate detection
    log_every_s: float = 60.0  # stats line in the service log; 0 = never

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_staleness", "port"):
            if int(getattr(self, name)) < 0:
                problems.append(f"buffer.{name}: must be ≥ 0, got {getattr(self, name)}")
        for name in ("capacity_groups", "batch_prompts", "max_samples_per_group", "max_tokens_per_sample",
                     "max_demo_tokens", "dedup_window", "max_message_mb"):
            if getattr(self, name) <= 0:
                problems.append(f"buffer.{name}: must be > 0, got {getattr(self, name)}")
        if self.filter not in FILTERS:
            problems.append(f"buffer.filter: {self.filter!r} is not one of {', '.join(FILTERS)}")
        if not 0 <= self.acc_lo <= self.acc_hi <= 1:
            problems.append(f"buffer.acc_lo/acc_hi: need 0 ≤ acc_lo ≤ acc_hi ≤ 1, got {self.acc_lo}, {self.acc_hi}")
        try:
            listen_hosts(self.host, self.advertise_host)
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def limits(self) -> Limits:
        return Limits(max_message_bytes=int(self.max_message_mb * (1 << 20)),
                      max_samples=self.max_samples_per_group, max_tokens=self.max_tokens_per_sample)

    @property
    def bind_address(self) -> str:
        """The ZMQ endpoint to bind (port * = any free one)."""
        return f"tcp://{listen_hosts(self.host, self.advertise_host)[0]}:{self.port or '*'}"

    def client_address(self, port: int) -> str:
        """The endpoint clients connect to, once the service is bound to `port`."""
        return f"tcp://{listen_hosts(self.host, self.advertise_host)[1]}:{port}"

    @classmethod
    def from_config(cls, cfg=None, batch_prompts: int | None = None, **overrides) -> BufferSettings:
        """From a RunConfig (uses .buffer and .learner.batch_prompts), a BufferConfig, a dict or None."""
        known = {f.name for f in fields(cls)}
        values: dict = {}
        if isinstance(cfg, BufferSettings):
            values = asdict(cfg)
        elif isinstance(cfg, dict):
            buf = cfg.get("buffer", cfg)
            values = {k: v for k, v in buf.items() if k in known}
            if "learner" in cfg and "batch_prompts" in cfg["learner"]:
                values["batch_prompts"] = cfg["learner"]["batch_prompts"]
            unknown = set(buf) - known - {"buffer", "learner"} - LAUNCHER_KEYS
            if unknown:
                raise ValueError(f"buffer settings: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        elif cfg is not None:
            buf = getattr(cfg, "buffer", cfg)
            values = {k: getattr(buf, k) for k in known if hasattr(buf, k)}
            learner = getattr(cfg, "learner", None)
            if learner is not None and hasattr(learner, "batch_prompts"):
                values["batch_prompts"] = learner.batch_prompts
        if batch_prompts is not None:
            values["batch_prompts"] = batch_prompts
        values.update(overrides)
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BufferSettings:
        return cls.from_config(json.loads(text))
