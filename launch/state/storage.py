"""Shared storage on a cluster: absolute paths, and proof at start that every node sees the run's files.

On several nodes every process opens the run folder, the model and the data by the path the driver
resolved. A relative path means something else on each node (each process has its own working
directory), and a folder on a disk only the head node has is simply missing elsewhere — the run then
dies minutes in, on the first node that looks (transformers even takes a missing relative model path
for a hub repo id). So:

- `absolutize(cfg, cwd)` makes every path-valued key absolute when the configuration is resolved for a
  run (before config.yaml is written), relative to the directory `algo-train` was started in;
- `check_shared_storage(run_dir, nodes, paths)` proves, before any role starts, that each other node
  reads a marker the driver wrote into the run folder, writes one the driver reads back, and sees the
  model and data paths; a node that cannot stops the run with one error naming the node, the path and
  what must be shared (`StorageError`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import algos
from configs.schema import RunConfig

# Every config key that holds a filesystem path (dotted: section.field), with each algorithm's own
# (`AlgoSpec.path_keys`, e.g. pure.prm_path).
PATH_KEYS = ("model.path", "teacher.path", "model.cache_dir", "data.path", "data.eval_path", "data.demos", "logging.output_dir",
             "resume", *(key for name in algos.names() for key in algos.get(name).path_keys))
MODEL_KEYS = ("model.path", "teacher.path")  # keys that may hold a Hub model id (`launch.prep.hub`)

WHAT_MUST_BE_SHARED = (
    "every node must see the run folder (--output), the model (model.path, or model.cache_dir for the built-in "
    "model), the teacher (teacher.path) and the data files (data.path, data.eval_path, data.demos) at the same absolute path, readable and "
    "the run folder writable — put them on a filesystem mounted on every node at the same mount point (NFS, "
    "Lustre, ...); see docs/running.md, 'On a cluster'")

CHECK_DIR = ".storage-check"  # under the run folder; removed once the check is done


class StorageError(RuntimeError):
    """A node cannot see or write the run's files."""


def absolutize(cfg: RunConfig, cwd: str | Path) -> RunConfig:
    """A copy of `cfg` whose path-valued keys (`PATH_KEYS`) are absolute; unset keys stay unset.

    A path starting with `~` is expanded for the user running `algo-train`; a relative one is joined
    to `cwd` (the directory `algo-train` was started in). Lexical only: symlinks are not resolved (a
    symlinked mount point keeps the name every node knows) and the path need not exist yet. Not paths,
    so left alone: a Hub dataset (`hf://...`) and chat-template text; a Hub model id in model.path or
    teacher.path becomes its snapshot directory in the local HF cache (`launch.prep.hub`), which every node
    must see.
    """
    from configs.data_section import is_template_file
    from launch.prep.hub import cached_snapshot, is_hub_id
    from tasks.loaders import HUB_DATA

    out = cfg.model_copy(deep=True)
    base = Path(cwd)
    template = out.data.chat_template
    for key in (*PATH_KEYS, *(("data.chat_template",) if template and is_template_file(template) else ())):
        section, _, field = key.rpartition(".")
        holder = getattr(out, section) if section else out
        value = getattr(holder, field)
        if value is None or value.startswith(HUB_DATA):
            continue
        if key in MODEL_KEYS and is_hub_id(value, base):
            value = str(cached_snapshot(value, key))
        setattr(holder, field, str(base / Path(value).expanduser()))
    return out


def shared_paths(cfg: RunConfig, model_dir: str | Path) -> dict[str, str]:
    """{config key: path} of the inputs every node opens: the model directory the roles load (the
    built-in model's lies under model.cache_dir) and the data files that are set."""
    paths = {"model.path" if cfg.model.path else "model.cache_dir": str(model_dir)}
    if cfg.teacher.path is not None:
        paths["teacher.path"] = cfg.teacher.path
    for key in ("data.path", "data.eval_path", "data.demos"):
        value = getattr(cfg.data, key.split(".")[1])
        if value is not None:
            paths[key] = value
    return paths


@dataclass(frozen=True)
class Node:
    node_id: str  # Ray's hex node id
    ip: str  # the node's address as Ray reports it

    def __str__(self) -> str:
        return f"{self.ip} (Ray node {self.node_id[:12]})"


def other_nodes(include_driver_node: bool = False) -> list[Node]:
    """The alive nodes of the Ray cluster this process is connected to; without the driver's own node
    by default (its processes see what the driver sees)."""
    import ray

    own = ray.get_runtime_context().get_node_id()
    return [Node(n["NodeID"], n["NodeManagerAddress"]) for n in ray.nodes()
            if n["Alive"] and (include_driver_node or n["NodeID"] != own)]


def probe_storage(check_dir: str, nonce: str, node_id: str, paths: dict[str, str]) -> list[str]:
    """Runs on one node: read the driver's marker, write this node's own, look for every path in
    `paths`. Returns what went wrong, one line each (empty: all well)."""
    problems = []
    marker = Path(check_dir) / "driver"
    try:
        seen = marker.read_text()
    except OSError as e:
        problems.append(f"cannot read the driver's marker {marker} ({type(e).__name__}: {e.strerror or e}): "
                        "the run folder is not shared with this node")
    else:
        if seen != nonce:
            problems.append(f"reads another file at {marker} (a different folder under the same path)")
    mine = Path(check_dir) / f"node-{node_id}"
    try:
        mine.write_text(nonce)
    except OSError as e:
        problems.append(f"cannot write {mine} ({type(e).__name__}: {e.strerror or e}): the run folder must be "
                        "writable from every node (checkpoints, metrics)")
    for key, path in paths.items():
        if not os.path.exists(path):
            problems.append(f"cannot see {key} = {path}")
    return problems


def check_shared_storage(run_dir: str | Path, nodes: list[Node], paths: dict[str, str] | None = None, *,
                         timeout_s: float = 120.0) -> None:
    """Prove that each node in `nodes` shares the run folder (both ways) and sees `paths`, or raise
    `StorageError` naming every failing node, the path and what must be shared.

    The driver writes a marker with a fresh random nonce into `run_dir/.storage-check/<nonce>/`; a Ray
    task pinned to each node (NodeAffinitySchedulingStrategy, hard; 0 CPUs so a busy node still runs
    it) runs `probe_storage` there; then the driver reads back each node's marker. A node that does not
    answer within `timeout_s` counts as failing. Paths are checked as given: absolutize them first.
    The check folder is removed afterwards. No nodes: nothing to check, Ray is not touched.
    """
    if not nodes:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nonce = secrets.token_hex(16)
    check_dir = Path(run_dir) / CHECK_DIR / nonce
    check_dir.mkdir(parents=True)
    try:
        (check_dir / "driver").write_text(nonce)
        task = ray.remote(num_cpus=0, max_retries=0)(probe_storage)
        refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
                .remote(str(check_dir), nonce, node.node_id, paths or {}): node for node in nodes}
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        failures = []
        for ref in done:
            node = refs[ref]
            try:
                problems = ray.get(ref)
            except Exception as e:  # the node died, or the task could not run there
                problems = [f"could not run the storage probe there ({type(e).__name__}: {str(e)[:300]})"]
            if not problems and _read(check_dir / f"node-{node.node_id}") != nonce:
                problems = [f"wrote {check_dir / f'node-{node.node_id}'} but the driver does not see it: the run "
                            "folder is not the same folder on both nodes"]
            failures += [f"node {node}: {p}" for p in problems]
        for ref in late:
            ray.cancel(ref, force=True)
            failures.append(f"node {refs[ref]}: no answer to the storage probe within {timeout_s:.0f} s")
    finally:
        shutil.rmtree(check_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run's check may still be using it
            check_dir.parent.rmdir()
    if failures:
        raise StorageError(f"shared storage check failed for run folder {run_dir}:\n  - " + "\n  - ".join(failures)
                           + f"\n{WHAT_MUST_BE_SHARED}")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None

