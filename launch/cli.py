"""`algo-train`: the command line.

  algo-train --algo NAME [--config FILE] [--actors N] [--model PATH] [--data PATH] [--demos PATH]
             [--max-staleness K] [--steps N] [--output DIR] [--force] [--set key=value ...] [--serial]
             [--ray-address ADDR] [--verbose] [--dry-run]
  algo-train --resume DIR [--steps N] [--set key=value ...]     continue a run (launch.state.rundir)
  algo-train eval --model DIR --data FILE [--n K] [--json OUT]   score a model (launch.commands.evaluate)
  algo-train plot RUN_DIR [RUN_DIR ...]                          curves of runs (launch.commands.plot)
  algo-train doctor [run flags] [--json FILE]                    is the cluster ready? (launch.doctor.command)

Configuration errors exit with status 2 and a message naming the key; nothing is started before the
whole configuration has validated. `--resume DIR` of a finished run says so without importing the
training stack (well under a second).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from configs.loading import ConfigError, dump_annotated, resolve
from launch.commands.run_flags import build_parser, flags_from_args


def parse(argv: list[str]):
    """(args, the run's RunConfig, the `launch.state.rundir.ResumePlan` with --resume else None)."""
    args = build_parser().parse_args(argv)
    if args.resume:
        from launch.state.rundir import plan_resume

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
    from launch.state.rundir import quick_finished

    try:
        steps = None if known.steps is None else int(known.steps)
    except ValueError:
        return None
    return quick_finished(known.resume, steps)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":
        from launch.commands.plot import main as plot_main

        return plot_main(argv[1:])
    if argv and argv[0] == "doctor":
        from launch.doctor.command import main as doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "eval":
        from launch.commands.evaluate import main as eval_main

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
        from launch.state.rundir import finished_message

        print(finished_message(Path(args.resume).absolute(), plan.step, cfg.learner.steps))
        return 0
    from launch.commands.train import train

    return train(cfg, force=args.force, resume=plan)


if __name__ == "__main__":
    sys.exit(main())
