"""What the resource plan (`launch.planning.resources`) counts with: a node's capacity (`Node`), one role's share of a
node (`Bundle`), the arithmetic of fitting shares into what is free, and the error a plan that does not fit raises."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

EPS = 1e-9


class ResourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    """What one node has: Ray's totals (CPU, GPU, memory in GiB, custom resources by name)."""

    name: str
    cpus: float
    gpus: float
    memory_gib: float
    custom: Mapping[str, float] = field(default_factory=dict)

    def capacity(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": self.gpus, "memory": self.memory_gib, **self.custom}

    def figures(self) -> str:
        extra = "".join(f", {k} {v:g}" for k, v in sorted(self.custom.items()))
        return f"{self.cpus:g} CPU, {self.gpus:g} GPU, {self.memory_gib:.1f} GiB{extra}"

    def describe(self) -> str:
        return f"{self.name}: {self.figures()}"


@dataclass(frozen=True)
class Bundle:
    """One role's share of a node. `ray_resources()` is what the placement group reserves (memory is
    checked by `plan` only: Ray's memory resource is an estimate taken when the node started)."""

    cpus: float
    gpus: float
    memory_gib: float
    custom: Mapping[str, float] = field(default_factory=dict)

    def demand(self) -> dict[str, float]:
        return {k: v for k, v in {"CPU": self.cpus, "GPU": self.gpus, "memory": self.memory_gib,
                                  **self.custom}.items() if v > 0}

    def ray_resources(self) -> dict[str, float]:
        return {k: v for k, v in {"CPU": self.cpus, "GPU": self.gpus, **self.custom}.items() if v > 0}

    def describe(self) -> str:
        parts = [f"{self.gpus:g} GPU"] if self.gpus else []
        parts += [f"{self.cpus:g} CPU", f"~{self.memory_gib:g} GiB"] + [f"{k} {v:g}" for k, v in sorted(self.custom.items())]
        return " + ".join(parts)


def copies(free: Mapping[str, float], need: Mapping[str, float]) -> int:
    """How many bundles of `need` fit into `free` (a bundle that needs nothing counts as fitting once more
    than any real count, which never happens: every bundle asks for CPUs)."""
    return min((math.floor((free.get(k, 0.0) + EPS) / v) for k, v in need.items()), default=10**9)


def take(free: dict[str, float], need: Mapping[str, float], n: int) -> None:
    for k, v in need.items():
        free[k] = free.get(k, 0.0) - n * v


def short_in(free: Sequence[Mapping[str, float]], count: int, b: Bundle) -> str:
    """Which resources the `count` bundles lack in total, or that the room is split across nodes."""
    short = []
    for k, v in b.demand().items():
        total = sum(max(0.0, f.get(k, 0.0)) for f in free)
        if count * v > total + EPS:
            unit = " GiB of memory" if k == "memory" else f" {k}"
            short.append(f"{count * v:.4g}{unit} needed, {total:.4g} free")
    return ", ".join(short) if short else "enough in total, but split across nodes: no node holds one more bundle"
