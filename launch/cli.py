"""`algo-train`: the command line.

  algo-train --algo NAME [--config FILE] [--actors N] [--model PATH] [--data PATH] [--demos PATH]
             [--max-staleness K] [--steps N] [--output DIR] [--force] [--set key=value ...] [--serial]
             [--ray-address ADDR] [--verbose] [--dry-run]
  algo-train --resume DIR [--steps N] [--set key=value ...]     continue a run (launch.rundir)
  algo-train eval --model DIR --data FILE [--n K] [--json OUT]   score a model (launch.evaluate_cmd)
  algo-train plot RUN_DIR [RUN_DIR ...]                          curves of runs (launch.plot)
  algo-train doctor [run flags] [--json FILE]                    is the cluster ready? (launch.doctor)

Configuration errors exit with status 2 and a message naming the key; nothing is started before the
whole configuration has validated. `--resume DIR` of a finished run says so without importing the
training stack (well under a second).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from configs.loading import ConfigError, dump_annotated, resolve

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
    p.add_argument("--max-staleness", type=int, metavar="K", help="buffer.max_staleness, in versions")
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
        "logging.verbose": args.verbose,
        "serial": args.serial,
        "ray_address": args.ray_address,
        "resume": args.resume,
        "max_restarts": args.max_restarts,
    }


def parse(argv: list[str]):
    """(args, the run's RunConfig, the `launch.rundir.ResumePlan` with --resume else None)."""
    args = build_parser().parse_args(argv)
    if args.resume:
        from launch.rundir import plan_resume

        if args.force:
            raise ConfigError(f"--force starts {args.resume} over and --resume continues it — pass one of them")
        plan = plan_resume(args.resume, args.algo, args.config, flags_from_args(args), args.overrides, Path.cwd())
        return args, plan.cfg, plan
    cfg = resolve(args.algo, args.config, flags_from_args(args), args.overrides)
    return args, cfg, None


def _quick_resume_check(argv: list[str]) -> str | None:
    """The finished-run message for `--resume DIR` with nothing left to train, from the run folder alone
    (no algorithm registry, no torch); None otherwise."""
    if "-h" in argv or "--help" in argv or "--dry-run" in argv:
        return None
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--resume")
    pre.add_argument("--steps")
    pre.add_argument("--set", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    if not known.resume or any(s.replace(" ", "").startswith("learner.steps=") for s in known.set):
        return None
    from launch.rundir import quick_finished

    try:
        steps = None if known.steps is None else int(known.steps)
    except ValueError:
        return None
    return quick_finished(known.resume, steps)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":
        from launch.plot import main as plot_main

        return plot_main(argv[1:])
    if argv and argv[0] == "doctor":
        from launch.doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "eval":
        from launch.evaluate_cmd import main as eval_main

        return eval_main(argv[1:])
    finished = _quick_resume_check(argv)
    if finished is not None:
        print(finished)
        return 0
    try:
        args, cfg, plan = parse(argv)
    except ConfigError as e:
        print(f"algo-train: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(dump_annotated(cfg))
        return 0
    if plan is not None and plan.finished:
        from launch.rundir import finished_message

        print(finished_message(Path(args.resume).absolute(), plan.step, cfg.learner.steps))
        return 0
    from launch.train import train

    return train(cfg, force=args.force, resume=plan)


if __name__ == "__main__":
    sys.exit(main())
