"""Entry point of a training run: run folder, resolved config, resource check, then the process graph."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from configs.loading import ConfigError, dump_annotated, read_yaml, resolve
from configs.schema import RunConfig
from launch.cluster import ClusterInfo
from launch.progress import Progress
from launch.resources import ResourceError, plan
from launch.storage import absolutize


def run_dir_for(cfg: RunConfig) -> Path:
    if cfg.resume:
        return Path(cfg.resume)
    if cfg.logging.output_dir:
        return Path(cfg.logging.output_dir)
    return Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}"


def resumed_config(cfg: RunConfig) -> RunConfig:
    """`--resume DIR` continues DIR's own configuration (its config.yaml); only `learner.steps` may grow."""
    path = Path(cfg.resume) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--resume {cfg.resume}: not a run folder (no config.yaml)")
    saved = resolve(config_file=str(path), overrides=[f"learner.steps={cfg.learner.steps}"])
    saved.resume = cfg.resume
    return saved


def train(cfg: RunConfig) -> int:
    try:
        address = cfg.ray_address  # this invocation's, also on --resume: the cluster is where the run goes on
        if cfg.resume:
            cfg = resumed_config(cfg)
        cluster = ClusterInfo.discover(address, serial=cfg.serial)
        cfg = cluster.resolve(cfg)  # "auto" decided, ray_address = the cluster joined: what config.yaml records
        cfg = absolutize(cfg, Path.cwd())  # every node must find the same files (launch.storage)
        plan(cfg, cluster.nodes, joined=cluster.cluster)
    except (ConfigError, ResourceError) as e:
        print(f"algo-train: {e}", file=sys.stderr)
        return 2
    run_dir = run_dir_for(cfg).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.resume:
        (run_dir / "config.yaml").write_text(dump_annotated(cfg) + "\n")
    else:
        read_yaml(run_dir / "config.yaml")  # still valid YAML
    progress = Progress(cfg.learner.steps, cfg.logging.progress)
    progress.message(f"[run] {cluster.describe()}")
    progress.message(f"[run] {cfg.algo}: {cfg.rollout.num_actors} actor(s), {cfg.learner.world_size} learner "
                     f"rank(s), max_staleness {cfg.buffer.max_staleness}, {cfg.learner.steps} steps -> {run_dir}")
    from launch.supervisor import supervise

    return supervise(cfg, run_dir)
