"""The flags of a run, shared by `algo-train` / `algo-train train` (launch.cli) and `algo-train doctor`
(launch.doctor.command), the dotted config keys the dedicated ones set, and the parser class of every
`algo-train` command (`Parser`)."""

from __future__ import annotations

import argparse
import difflib
import re

UNRECOGNIZED = "unrecognized arguments: "
INVALID_CHOICE = re.compile(r"invalid choice: '(.*?)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, and with the closest valid flag or choice in its errors.

    Why: argparse's default takes any unique prefix, so `--actor 2` silently meant `--actors 2` and a flag
    added later could change what an old command line means; a mistyped flag got only "unrecognized
    arguments" (Python 3.11's argparse suggests nothing)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        super().error(message + did_you_mean(message, list(self._option_string_actions)))


def did_you_mean(message: str, options: list[str]) -> str:
    """' — did you mean ...?' for an argparse error about unknown flags (the closest of `options`, by
    difflib's ratio) or an invalid choice (the closest choice, case ignored); '' when nothing is close."""
    if message.startswith(UNRECOGNIZED):
        flags = [w.split("=", 1)[0] for w in message.removeprefix(UNRECOGNIZED).split() if w.startswith("-")]
        pairs = [(f, close[0]) for f in flags if (close := difflib.get_close_matches(f, options, n=1))]
        if len(pairs) == 1:
            return f" — did you mean {pairs[0][1]}?"
        return (" — did you mean " + ", ".join(f"{c} (for {f})" for f, c in pairs) + "?") if pairs else ""
    choice = INVALID_CHOICE.search(message)
    if choice:
        variant = VARIANTS.get(re.sub(r"[^a-z]", "", choice.group(1).lower()))
        if variant:
            return f" — {choice.group(1)} is a variant here: {variant}"
        close = difflib.get_close_matches(choice.group(1).lower(), re.findall(r"'([^']*)'", choice.group(2)), n=1)
        return f" — did you mean {close[0]!r}?" if close else ""
    return ""


# --algo names of the field that are options of ours (docs/algorithms.md; the keys' descriptions in --dry-run)
VARIANTS = {
    "drgrpo": "--algo grpo --set grpo.use_std=false --set loss.agg=seq-mean-token-sum-norm",
    "dapo": "--algo grpo --set loss.clip_high=0.28 --set buffer.filter=extreme --set loss.overlong_filter=true "
            "(or the soft punishment: --set loss.overlong_cache_tokens=N)",
    "gspo": "--algo grpo --set loss.ratio_level=sequence --set loss.agg=seq-mean-token-mean "
            "(the paper's clip ranges: --set loss.clip_low=3e-4 --set loss.clip_high=4e-4)",
    "ppo": "no value model here: the closest is --algo grpo (group baseline) or --algo rloo",
}


def algorithms_text() -> str:
    """The algorithms with their one-line summaries, for a --help epilog."""
    import algos

    return "algorithms:\n" + "\n".join(f"  {n:6s} {algos.get(n).summary}" for n in algos.names())


def build_parser(add_help: bool = True) -> Parser:
    """A parser holding the run flags (`add_run_flags`) alone: the parent of `algo-train doctor`'s parser."""
    p = Parser(prog="algo-train", add_help=add_help, description="Asynchronous actor-learner RL for language models.",
               epilog=algorithms_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(p)
    return p


def add_run_flags(p: argparse.ArgumentParser) -> None:
    import algos

    p.add_argument("--algo", choices=algos.names(), help="algorithm (default config: configs/<algo>.yaml)")
    p.add_argument("--config", metavar="FILE",
                   help="your YAML, laid over configs/<algo>.yaml of the algorithm it names (`algo:`) or --algo")
    p.add_argument("--actors", type=int, metavar="N", help="vLLM actor processes (rollout.num_actors)")
    p.add_argument("--model", metavar="PATH", help="local HF model directory, or a Hub id (org/name) in the local "
                                                  "HF cache (model.path)")
    p.add_argument("--data", metavar="PATH", help="train .jsonl/.json/.parquet in veRL, MATH or GSM8K layout, or "
                                                  "hf://NAME[:CONFIG] (data.path)")
    p.add_argument("--demos", metavar="PATH", help="teacher trajectories for LUFFY / demonstrations for SFT")
    p.add_argument("--max-staleness", type=staleness_flag, metavar="K",
                   help="buffer.max_staleness, in versions; auto = chosen from measured wait and step times")
    p.add_argument("--steps", type=int, metavar="N", help="learner steps = weight pushes (learner.steps); each takes "
                                                          "mini_batches × epochs optimiser steps")
    p.add_argument("--output", metavar="DIR", help="run folder (default runs/<algo>-<timestamp>); one that holds "
                                                   "this command's run is continued from its checkpoint")
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
