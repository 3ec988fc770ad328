"""`algo-train`: the command line.

  algo-train --algo NAME [--actors N] [--config FILE] [--model PATH] [--data PATH] [--demos PATH]
             [--max-staleness K] [--steps N] [--output DIR] [--set key=value ...] [--serial]
             [--ray-address ADDR] [--dry-run] [--resume DIR]

Configuration errors exit with status 2 and a message naming the key; nothing is started before the
whole configuration has validated.
"""

from __future__ import annotations

import argparse
import sys

import algos
from configs.loading import ConfigError, dump_annotated, resolve
from configs.schema import RunConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="algo-train",
        description="Asynchronous actor-learner RL for language models.",
        epilog="algorithms:\n" + "\n".join(f"  {n:6s} {algos.get(n).summary}" for n in algos.names())
        + "\n\nPlot runs: algo-train plot RUN_DIR [RUN_DIR ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--algo", choices=algos.names(), help="algorithm (default config: configs/<algo>.yaml)")
    p.add_argument("--config", metavar="FILE", help="YAML config to start from instead of configs/<algo>.yaml")
    p.add_argument("--actors", type=int, metavar="N", help="vLLM actor processes (rollout.num_actors)")
    p.add_argument("--model", metavar="PATH", help="local HF model directory (model.path)")
    p.add_argument("--data", metavar="PATH", help="train parquet/JSONL in veRL layout (data.path)")
    p.add_argument("--demos", metavar="PATH", help="teacher trajectories for LUFFY / demonstrations for SFT")
    p.add_argument("--max-staleness", type=int, metavar="K", help="buffer.max_staleness, in versions")
    p.add_argument("--steps", type=int, metavar="N", help="learner steps = weight pushes (learner.steps); each takes mini_batches × epochs optimiser steps")
    p.add_argument("--output", metavar="DIR", help="run folder (default runs/<algo>-<timestamp>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any config key, e.g. --set loss.clip_high=0.28 (repeatable)")
    p.add_argument("--serial", action="store_true", default=None, help="no Ray: learner and actors run in this process (debugging)")
    p.add_argument("--ray-address", metavar="ADDR", help="join an existing Ray cluster")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    p.add_argument("--dry-run", action="store_true", help="print the fully resolved config and exit")
    return p


def flags_from_args(args: argparse.Namespace) -> dict:
    """Dedicated CLI flags -> dotted config keys (None means 'not given')."""
    return {
        "rollout.num_actors": args.actors,
        "model.path": args.model,
        "data.path": args.data,
        "data.task": "file" if args.data else None,
        "data.demos": args.demos,
        "buffer.max_staleness": args.max_staleness,
        "learner.steps": args.steps,
        "logging.output_dir": args.output,
        "serial": args.serial,
        "ray_address": args.ray_address,
        "resume": args.resume,
    }


def parse(argv: list[str]) -> tuple[argparse.Namespace, RunConfig]:
    args = build_parser().parse_args(argv)
    if args.algo is None and args.config is None:
        raise ConfigError("--algo: required (choose one of " + ", ".join(algos.names()) + ") or pass --config FILE")
    cfg = resolve(args.algo, args.config, flags_from_args(args), args.overrides)
    return args, cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":
        from launch.plot import main as plot_main

        return plot_main(argv[1:])
    try:
        args, cfg = parse(argv)
    except ConfigError as e:
        print(f"algo-train: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(dump_annotated(cfg))
        return 0
    from launch.train import train

    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
