"""`algo-train doctor`: is this cluster ready for this run? Checked node by node in a few minutes, before a
long run, with the run's own flags (`--ray-address`, `--model`, `--config`, `--set ...`).

Prints one row per check — PASS, WARN or FAIL, what was found, and for a failure the fix — and exits 1 on
any FAIL (`--json FILE` writes the rows for machines). The checks:

- resources  the run's own plan: room for every learner rank, actor and teacher engine (the teacher's on the
             driver's node, `launch.planning.resources`);
- versions   every node has the tested vLLM (`launch.planning.versions`) and the driver's torch, Ray, transformers;
- storage    every node reads a file the driver just wrote beside the run folder (shared storage), and
             the model, data and teacher paths the run names;
- interfaces on a joined cluster, the gloo/NCCL interface each node's Ray was started with exists there
             (unset: needed only by a learner of several ranks);
- context    data.max_prompt_tokens + rollout.max_response_tokens fit the model's context;
- kv cache   the KV tokens each engine gets hold at least one whole sequence (`launch.planning.model_shape`);
- learner    bytes per token the learner needs at the model's real width and vocabulary, measured
             (`launch.doctor.probes.learner_memory`), in the start line's whole budget of rank 0
             (`launch.planning.memory_estimate.run_memory`) against its GPU, and its pinned push
             staging against the node's memory;
- weights    the real weight path (`launch.doctor.weights`): a small model of the run's architecture,
             learner rank 0 (started as the run starts it: its rendezvous and interface choice) and one
             engine per actor node: a full push, a delta push, a push the sender aborts (the engine must
             serve under no version afterwards) and a fresh rendezvous, with bytes/s.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from dataclasses import asdict
from pathlib import Path

from configs.loading import ConfigError, resolve
from configs.schema import RunConfig
from launch.commands.run_flags import Parser, flags_from_args
from launch.commands.run_flags import build_parser as run_parser
from launch.doctor.report import Check, table

PROBE_TOKENS = 1024  # tokens of the learner's memory probe


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="algo-train doctor", parents=[run_parser(add_help=False)],
               description="Check, node by node, that this cluster can run this configuration.")
    p.add_argument("--json", metavar="FILE", help="also write the checks as JSON to FILE")
    p.add_argument("--skip", action="append", default=[], choices=["learner", "weights"],
                   help="leave out a slow check (repeatable)")
    return p


def config_for(args: argparse.Namespace) -> RunConfig:
    """The run's config with its paths as the run would have them (absolute; a Hub model id resolved
    through the local HF cache, `launch.state.storage.absolutize`)."""
    from launch.state.storage import absolutize

    return absolutize(resolve(args.algo, args.config, flags_from_args(args), args.overrides), Path.cwd())


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """`algo-train doctor` with its parsed flags; returns the exit status (1 on any FAIL)."""
    try:
        cfg = config_for(args)
    except ConfigError as e:
        print(f"algo-train doctor: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    checks = run_checks(cfg, skip=set(args.skip), say=lambda m: print(m, file=sys.stderr, flush=True))
    print(table(checks))
    print(f"(in {time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(c) for c in checks], indent=1) + "\n")
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def run_checks(cfg: RunConfig, skip: set[str], say) -> list[Check]:
    from launch.doctor import checks as dc
    from launch.planning.cluster import ClusterInfo, init_ray
    from launch.planning.resources import ResourceError

    try:
        cluster = ClusterInfo.discover(cfg.ray_address)
        cfg = cluster.resolve(cfg)
    except ResourceError as e:
        return [Check("run", "cluster", "FAIL", str(e), "start Ray on every node, or leave out --ray-address")]
    say(f"[doctor] {cluster.describe()}")
    try:
        shape = dc.read_shape(cfg)
    except (OSError, KeyError, ValueError) as e:
        return [Check("run", "model", "FAIL", f"cannot read the model's config.json: {e}",
                      "pass --model DIR, an HF model directory")]
    checks = [dc.plan_check(cfg, cluster), *dc.config_checks(cfg, shape)]
    init_ray(cfg)
    try:
        probe = dc.write_probe(cfg, secrets.token_hex(8))
        say("[doctor] node facts (versions, storage, interfaces, KV cache)")
        checks += dc.node_checks(cfg, shape, probe, cluster.cluster)
        if "learner" not in skip:
            say("[doctor] learner memory per token (1 and 2 layers at the model's width and vocabulary)")
            checks += dc.learner_checks(cfg, PROBE_TOKENS)
        if "weights" not in skip:
            from launch.doctor.weights import weight_checks

            say("[doctor] weight path: full, delta, aborted push and a fresh rendezvous")
            checks += weight_checks(cfg, say)
    finally:
        import ray

        ray.shutdown()
    return checks


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
