"""The flags of a run, shared by `algo-train` (launch.cli) and `algo-train doctor` (launch.doctor.command), and
the dotted config keys the dedicated ones set."""

from __future__ import annotations

import argparse

EPILOG_TAIL = """
a run folder (--output, default runs/<algo>-<timestamp>) holds one run: an existing one is refused
unless --resume DIR (continue it, with its own config.yaml) or --force (start it over).

other commands:
  algo-train eval --model DIR --data FILE [--n K]   accuracy, pass@k and mean@k of a model on a data file
  algo-train plot RUN_DIR [RUN_DIR ...]             plot runs' curves
  algo-train doctor [the run's flags] [--json FILE]  check, node by node, that the cluster can run them"""


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    import algos

    p = argparse.ArgumentParser(
        prog="algo-train", add_help=add_help,
        description="Asynchronous actor-learner RL for language models.",
        epilog="algorithms:\n" + "\n".join(f"  {n:6s} {algos.get(n).summary}" for n in algos.names())
        + "\n" + EPILOG_TAIL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--algo", choices=algos.names(), help="algorithm (default config: configs/<algo>.yaml)")
    p.add_argument("--config", metavar="FILE",
                   help="your YAML, laid over configs/<algo>.yaml of the algorithm it names (`algo:`) or --algo")
    p.add_argument("--actors", type=int, metavar="N", help="vLLM actor processes (rollout.num_actors)")
    p.add_argument("--model", metavar="PATH", help="local HF model directory (model.path)")
    p.add_argument("--data", metavar="PATH", help="train parquet/JSONL in veRL layout (data.path)")
    p.add_argument("--demos", metavar="PATH", help="teacher trajectories for LUFFY / demonstrations for SFT")
    p.add_argument("--max-staleness", type=staleness_flag, metavar="K",
                   help="buffer.max_staleness, in versions; auto = chosen from measured wait and step times")
    p.add_argument("--steps", type=int, metavar="N", help="learner steps = weight pushes (learner.steps); each takes "
                                                          "mini_batches × epochs optimiser steps")
    p.add_argument("--output", metavar="DIR", help="run folder (default runs/<algo>-<timestamp>); must not hold "
                                                   "another run")
    p.add_argument("--force", action="store_true", help="start over in an --output folder that holds a run "
                                                        "(deletes its contents)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override any config key, e.g. --set loss.clip_high=0.28 (repeatable)")
    p.add_argument("--serial", action="store_true", default=None, help="no Ray: learner and actors run in this process (debugging)")
    p.add_argument("--ray-address", metavar="ADDR", help="join an existing Ray cluster")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint, with its "
                                                   "config.yaml; --steps N trains it longer")
    p.add_argument("--max-restarts", type=int, metavar="N",
                   help="resume the run by itself from its last checkpoint, up to N times, when a learner rank dies")
    p.add_argument("--verbose", action="store_true", default=None,
                   help="show other programs' warnings and progress bars (logging.verbose)")
    p.add_argument("--dry-run", action="store_true", help="print the fully resolved config and exit")
    return p


def staleness_flag(value: str) -> int | str:
    """--max-staleness: a whole number of versions, or auto."""
    if value == "auto" or value.isdigit():
        return value if value == "auto" else int(value)
    raise argparse.ArgumentTypeError(f"expected a whole number of versions or auto, got {value!r}")


def flags_from_args(args: argparse.Namespace) -> dict:
    """Dedicated CLI flags -> dotted config keys (None means 'not given')."""
    return {
        "rollout.num_actors": args.actors,
        "model.path": args.model,
        "data.path": args.data,
        "data.task": "file" if args.data else None,
        "data.demos": args.demos,
        "buffer.max_staleness": args.max_staleness,
        # a number is a fixed bound, also over a config file that spells out max_staleness_auto: true
        "buffer.max_staleness_auto": False if isinstance(args.max_staleness, int) else None,
        "learner.steps": args.steps,
        "logging.output_dir": args.output,
        "logging.verbose": args.verbose,
        "serial": args.serial,
        "ray_address": args.ray_address,
        "resume": args.resume,
        "max_restarts": args.max_restarts,
    }
