"""`algo-train`: the command line.

  algo-train [train] --algo NAME [--config FILE] [--actors N] [--model PATH] [--data PATH] [--demos PATH]
             [--max-staleness K] [--steps N] [--output DIR] [--force] [--set key=value ...] [--serial]
             [--ray-address ADDR] [--verbose] [--dry-run] [--push-to-hub REPO [--hub-public]]
  algo-train --resume DIR [--steps N] [--set key=value ...]     continue a run (launch.state.rundir)
  algo-train eval --model DIR --data FILE [--n K] [--json OUT]   score a model (launch.commands.evaluate)
  algo-train plot RUN_DIR [RUN_DIR ...]                          curves of runs (launch.commands.plot)
  algo-train doctor [run flags] [--json FILE]                    is the cluster ready? (launch.doctor.command)
  algo-train scale RUN_DIR --actors N [--wait S]                 add or remove actors of a live run (launch.commands.scale)
  algo-train --version

Commands are argparse subparsers (`evaluate` is another name of `eval`); no command is `train`. No parser
takes abbreviations, and an unknown flag or choice is answered with the closest valid one
(`launch.commands.run_flags.Parser`). A command that names an `--output` folder holding its run again (a
Slurm requeue re-runs the same line) continues that run from its checkpoint (`launch.state.rundir.plan_rerun`).

Configuration errors exit with status 2 and a message naming the key; nothing is started before the
whole configuration has validated. `--resume DIR` of a finished run says so without importing the
training stack (well under a second); so does `--help`, which imports neither torch nor vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

from configs.loading import ConfigError, dump_annotated, read_user, resolve, user_keys
from configs.presets import built_in, describe
from launch.commands.run_flags import Parser, add_run_flags, algorithms_text, flags_from_args
from launch.prep.testbed import TESTBEDS

EXAMPLES = """
examples:
  algo-train --algo grpo --steps 50                  the built-in task on this machine (built-in tiny model)
  algo-train --algo grpo --model ~/models/Qwen2.5-0.5B-Instruct --data train.jsonl --output runs/q \\
      --set rollout.max_response_tokens=1024 --set learner.lr=1e-6
  algo-train --algo grpo ... --output runs/q         the same line again continues runs/q from its checkpoint
  algo-train eval --model runs/q/hf/step_350 --data test.jsonl --n 4
  algo-train doctor --algo pure --actors 8 --ray-address 10.0.0.1:6379

a run folder (--output, default runs/<algo>-<timestamp>) holds one run: a command naming a folder that holds
its run continues it (a different configuration is refused by name); --resume DIR continues it with its
own config.yaml; --force starts it over. `algo-train COMMAND --help` shows a command's flags."""

# the commands besides train: (name and aliases, module with build_parser() and run(args), one-line help)
COMMANDS = ((("eval", "evaluate"), "launch.commands.evaluate", "accuracy, pass@k and mean@k of a model on a data file"),
            (("plot",), "launch.commands.plot", "plot runs' curves"),
            (("doctor",), "launch.doctor.command", "check, node by node, that the cluster can run a run's flags"),
            (("scale",), "launch.commands.scale", "ask a live run for another actor count"))
COMMAND_NAMES = {name for names, _, _ in COMMANDS for name in names}


class ShowVersion(argparse.Action):
    """--version: read from the installed distributions' metadata when asked, so --help imports nothing."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def version_text() -> str:
    """'algo-train (impala-lm 0.1.0) with torch 2.6.0, vllm 0.32.0, Python 3.11.7' (what is installed)."""
    import platform
    from importlib import metadata

    from launch.planning.versions import installed_vllm

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    dist, vllm = installed_vllm() or ("vllm", "not installed")
    return (f"algo-train (impala-lm {version('impala-lm')}) with torch {version('torch')}, {dist} {vllm}, "
            f"Python {platform.python_version()}")


def add_train_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a training run that `doctor` does not take."""
    p.add_argument("--push-to-hub", metavar="REPO", help="after the run, upload its final HF export to the Hub "
                   "repository REPO (user/name; created private unless --hub-public)")
    p.add_argument("--hub-public", action="store_true", help="create the --push-to-hub repository public")
    p.add_argument("--testbed", choices=TESTBEDS, help="a built-in testbed laid over configs/<algo>.yaml: steps = "
                   "4-5 digit worked solutions, a 4-layer warm model and (--algo pure) a learned PRM; tools = 7-8 "
                   "digit problems with a calculator tool and a warm model that saw a few tool-using demonstrations; "
                   "built and cached at the first run (launch.prep.testbed)")


def build_parser() -> Parser:
    """`algo-train`: the run flags (no command = train), and a subparser per command (`train`, `COMMANDS`)."""
    from importlib import import_module

    fmt = argparse.RawDescriptionHelpFormatter
    p = Parser(prog="algo-train", description="Asynchronous actor-learner RL for language models.",
               epilog=algorithms_text() + "\n" + EXAMPLES, formatter_class=fmt)
    p.add_argument("--version", action=ShowVersion, help="print the versions of algo-train, torch and vLLM")
    add_run_flags(p)
    add_train_flags(p)
    subs = p.add_subparsers(dest="command", metavar="COMMAND", title="commands (none: train)", parser_class=Parser)
    train = subs.add_parser("train", prog="algo-train [train]", help="train (the same as no command)",
                            description=p.description, epilog=algorithms_text(), formatter_class=fmt)
    add_run_flags(train)
    add_train_flags(train)
    for names, where, what in COMMANDS:
        module = import_module(where)
        own = module.build_parser()
        sub = subs.add_parser(names[0], aliases=names[1:], parents=[own], add_help=False, help=what,
                              description=own.description, epilog=own.epilog, formatter_class=own.formatter_class)
        sub.set_defaults(handler=module.run)
    p.commands = subs.choices  # name (or alias) -> its parser, for `parse_args`
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The parsed command line. No command is `train`, parsed by its subparser (in the main parser a stray
    value, `2` of a mistyped `--actor 2`, would be taken for a command name). An unknown flag is reported by
    the parser of its command (its usage, its closest flag); a command must come first."""
    parser = build_parser()
    if not argv or argv[0].startswith("-") and not {"-h", "--help", "--version"} & set(argv):
        argv = ["train", *argv]
    args, extras = parser.parse_known_args(argv)
    misplaced = [w for w in extras if w in parser.commands]
    if misplaced:
        parser.error(f"{misplaced[0]}: a command comes first — algo-train {misplaced[0]} [its flags]")
    if extras:
        parser.commands.get(args.command, parser).error("unrecognized arguments: " + " ".join(extras))
    return args


def parse(argv: list[str]):
    """(args, the run's RunConfig, the `launch.state.rundir.ResumePlan` when it continues a run else None)."""
    args = parse_args(argv)
    return (args, *run_config(args))


def run_config(args: argparse.Namespace):
    """(the RunConfig of a training command, its ResumePlan or None): `--resume DIR` continues DIR; an
    `--output` folder that holds this command's run continues it (`launch.state.rundir.plan_rerun`)."""
    from launch.state.rundir import plan_rerun, plan_resume

    flags = flags_from_args(args)
    config, overrides = args.config, args.overrides
    if args.resume:
        if args.force:
            raise ConfigError(f"--force starts {args.resume} over and --resume continues it — pass one of them")
        if args.testbed:
            raise ConfigError(f"--testbed: {args.resume}'s config.yaml already holds its testbed — drop --testbed")
        plan = plan_resume(args.resume, args.algo, args.config, flags, args.overrides, Path.cwd())
        return plan.cfg, plan
    if args.testbed:  # the warm model (and PRM) as model.path (pure.prm_path): built by `main` before the run
        from launch.prep.testbed import command_for_testbed

        config, overrides = command_for_testbed(args.testbed, args.algo, args.config, flags, args.overrides)
    if args.output and not args.force:
        plan = plan_rerun(args.output, args.algo, config, flags, overrides, Path.cwd())
        if plan is not None:
            return plan.cfg, plan
    return resolve(args.algo, config, flags, overrides), None


def given_keys(args: argparse.Namespace) -> set[str]:
    """The dotted keys a training command gives (its --config file, flags and --set), as `resolve` read them
    (the notices of veRL/TRL names it said are not said again)."""
    with contextlib.redirect_stderr(io.StringIO()):
        user = read_user(args.config) if args.config else {}
    return user_keys(user, flags_from_args(args), args.overrides)


def _sets_steps(assignment: str) -> bool:
    """Whether a `--set KEY=VALUE` sets learner.steps, under our name or a veRL/TRL name read as it."""
    from configs.aliases import accepted

    key = assignment.partition("=")[0].strip()
    alias = accepted(key)
    return (alias.ours if alias else key) == "learner.steps"


def _quick_resume_check(argv: list[str]) -> str | None:
    """The finished-run message for `--resume DIR` with nothing left to train, from the run folder alone
    (no algorithm registry, no torch); None otherwise."""
    if {"-h", "--help", "--dry-run", "--version"} & set(argv) or argv[:1] and argv[0] in COMMAND_NAMES:
        return None
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--resume")
    pre.add_argument("--steps")
    pre.add_argument("--set", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    if not known.resume or any(_sets_steps(s) for s in known.set):
        return None
    from launch.state.rundir import quick_finished

    try:
        steps = None if known.steps is None else int(known.steps)
    except ValueError:
        return None
    return quick_finished(known.resume, steps)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    finished = _quick_resume_check(argv)
    if finished is not None:
        print(finished)
        return 0
    try:
        args = parse_args(argv)
        if args.command not in (None, "train"):
            return args.handler(args)
        cfg, plan = run_config(args)
    except ConfigError as e:
        print(f"algo-train: {e}", file=sys.stderr)
        return 2
    said = None if plan is not None else describe(cfg, given_keys(args))
    if args.dry_run:
        if said:  # which preset set applied, and why (configs.presets)
            print(said, file=sys.stderr)
        print(dump_annotated(cfg))
        return 0
    if plan is not None and plan.finished:
        from launch.state.rundir import finished_message

        print(finished_message(Path(args.resume or args.output).absolute(), plan.step, cfg.learner.steps))
        return 0
    if args.testbed:  # what the config's model.path (and pure.prm_path) name, unless cached (launch.prep.testbed)
        from launch.prep.testbed import build_testbed

        build_testbed(args.testbed, args.algo, flags_from_args(args), args.overrides)
    from launch.commands.train import train

    return train(cfg, force=args.force, resume=plan, push_to=args.push_to_hub, public=args.hub_public,
                 presets=None if said is None or built_in(cfg.model.path, cfg.model.cache_dir) else said)


if __name__ == "__main__":
    sys.exit(main())
