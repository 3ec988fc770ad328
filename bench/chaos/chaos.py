"""Chaos, measured (issues 23 and 33): does a run survive its processes being killed or stuck where it hurts?
Also: how long does the learner idle for each fault, and does the run still train every prompt exactly once?

What it does: runs the quick-start (`algo-train --algo grpo`, the built-in tiny model, `--actors` vLLM actors,
`--learner-ranks` learner ranks) with `max_restarts` and checkpoints every `--save-every` steps, and injects
the faults `--faults` names (bench/chaos/chaos_monkey.py):
  - kill (the default, and all there was before issue 33): after every ~`--kill-every-s` seconds of training
    (each gap drawn uniformly from 0.5-1.5 times it; a second counts while the run trains, i.e. has finished
    a step within the last 5 s, has a committed checkpoint to resume from and has all its actors: restarts,
    also those that go on in the background, and evaluations do not count, so the run trains between faults
    however long its restarts take, and each fault's effect is its own), SIGKILL (as the OOM killer would)
    one process: the role drawn with a seeded RNG (an actor, the buffer, a learner rank; equally likely), then
    which actor or rank (with `--learner-ranks 2`, rank 1 too); its pid comes from the run folder's
    processes.json (rewritten by the run after each restart) and must be alive in the run's session;
  - snapshot: at such a moment instead, SIGKILL the buffer process while the next checkpoint's buffer
    snapshot is asked for or written (the staged checkpoint holds the learner's part but not the snapshot,
    or the buffer's temp file: bench/chaos/chaos_procs.py);
  - stuck: at such a moment instead, SIGSTOP a random actor's vLLM engine-core process (a child of the actor)
    for `--stuck-s` seconds (longer than a request's deadline), then SIGCONT it if it still exists; the next
    periodic fault waits until then;
  - join (issue 42 item 5, review gpu_path_3 F1): at such a moment instead, SIGKILL a random actor, then
    SIGSTOP its successor's engine core for `--join-stall-s` seconds (longer than the 30 s progress deadline)
    as it enters the join (its engine built: the KV-cache line in logs/actor-<i>.log; then its first new
    file descriptor, the connection to the group's store): the driver rebuilds the weight-sync group with
    it, and the live engines wait in the rendezvous with their requests in flight; then SIGCONT (at once, recorded "too late", when the console says it joined
    already). The report counts actor restarts no actor fault explains: a live engine replaced;
  - startup: once, SIGKILL an actor or the buffer during start-up, 0-`--startup-within-s` seconds after its
    process appears, before the first step (a learner rank killed before the first checkpoint stops the run
    for good, by design);
  - drain: once, SIGKILL a random role after the last step's progress line, while the run drains its actors
    (at once) or writes its final checkpoint (once it is staged; which of the two is drawn).
  - env (issue 39 item 5): the run is multi-turn with `env.environment=bench/chaos/chaos_env.py:FlakyStep`,
    whose step raises on ~10 % of calls and hangs past `env.call_timeout_s` (`--env-timeout-s`) on ~5 %
    (deterministic by a hash of the call); the report sums env/errors and env/timeouts over metrics.jsonl.
When the mix holds several periodic kinds, each periodic fault's kind is drawn; no periodic fault comes
after the last step's progress line.

What it measures (the report, and a section appended to bench/RESULTS.md unless `--results -`):
- completion: the exit status, the steps the final checkpoint holds against the steps asked;
- restarts per role, from the run's own console lines (bench/chaos/chaos_console.py) and config.yaml's `resumed`
  record, beside the kills that caused them;
- per fault (bench/chaos/chaos_report.py): kind, victim, time, the restart time the run's line reports, and the
  learner's idle time around it (the largest gap between consecutive learner steps from the fault until the
  run is back to training), beside the typical step gap outside the faults;
- prompts lost or trained twice (bench/chaos/chaos_audit.py), from the final checkpoint's prompt ledger and buffer
  snapshot against a re-walk of each actor's shard.

    python bench/chaos/chaos.py                                # the quick-start's 350 steps
    python bench/chaos/chaos.py --steps 60 --kill-every-s 30   # a short try-out
    python bench/chaos/chaos.py --faults kill,startup,drain,snapshot,stuck --learner-ranks 2   # every fault kind
    python bench/chaos/chaos.py --faults join,env --steps 150 --kill-every-s 30   # F1's stalled join, a flaky env
    python bench/chaos/chaos.py --reuse --out-dir DIR          # report an earlier run again, starting nothing

The goal (issue 23): the run completes, 0 lost, 0 trained twice.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chaos.chaos_monkey import KINDS, FaultPlan, Monkey  # noqa: E402
from bench.chaos.chaos_report import analyse, load_faults, section  # noqa: E402
from bench.common.runs import check_extras, load_average, log, run_algo_train  # noqa: E402

RESERVED = {"learner.steps": "--steps", "max_restarts": "--max-restarts", "learner.save_every": "--save-every",
            "rollout.num_actors": "--actors", "learner.world_size": "--learner-ranks"}
ENV_CLASS = Path(__file__).with_name("chaos_env.py")  # the env fault's environment (bench/chaos/chaos_env.py)
RANK_CPUS = 0.5  # learner.cpus_per_rank with several ranks: 2 ranks beside 2 actors (0.5 core each) fit 2 cores


def parse_faults(text: str) -> list[str]:
    """--faults: comma-separated kinds, in KINDS order; ValueError naming what is wrong."""
    asked = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in asked if k not in KINDS]
    if unknown or not asked:
        raise ValueError(f"--faults {text!r}: {'unknown kind ' + ', '.join(unknown) if unknown else 'no kind'}; "
                         f"choose from {','.join(KINDS)}")
    return [k for k in KINDS if k in asked]


def overrides(args) -> list[str]:
    """The run's --set overrides: the bench's own, then --extra (which may override learner.cpus_per_rank)."""
    ranks = [f"learner.cpus_per_rank={RANK_CPUS}"] if args.learner_ranks > 1 else []
    if "env" in args.faults:  # two policy turns, the environment's step between them (bench/chaos/chaos_env.py)
        ranks += [f"env.environment={ENV_CLASS}:FlakyStep", "env.max_turns=2",
                  f"env.call_timeout_s={args.env_timeout_s:g}"]
    return [f"learner.steps={args.steps}", f"max_restarts={args.max_restarts}", f"learner.save_every={args.save_every}",
            f"rollout.num_actors={args.actors}", f"learner.world_size={args.learner_ranks}", *ranks, *args.extra]


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=350, help="learner steps (the quick-start's)")
    p.add_argument("--kill-every-s", type=float, default=60.0, help="mean seconds of training between periodic faults")
    p.add_argument("--seed", type=int, default=0, help="seed of the victims' draw")
    p.add_argument("--faults", default="kill", help=f"fault kinds, comma-separated, of {','.join(KINDS)} (module docstring)")
    p.add_argument("--actors", type=int, default=2, help="rollout.num_actors (the runs in bench/RESULTS.md had 2)")
    p.add_argument("--learner-ranks", type=int, default=1, help="learner.world_size (2: rank 1 can be a victim too)")
    p.add_argument("--stuck-s", type=float, default=60.0, help="seconds a stuck engine core stays SIGSTOPped")
    p.add_argument("--join-stall-s", type=float, default=45.0,
                   help="join fault: seconds the successor's engine core is held in the weight-sync join")
    p.add_argument("--env-timeout-s", type=float, default=5.0,
                   help="env fault: env.call_timeout_s, past which a hanging environment call is cut")
    p.add_argument("--startup-within-s", type=float, default=30.0, help="start-up kill: 0..this after its victim appears")
    p.add_argument("--max-restarts", type=int, default=40, help="learner restarts the run may make")
    p.add_argument("--save-every", type=int, default=10, help="learner.save_every (steps between checkpoints)")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE", help="more overrides of the run")
    p.add_argument("--out-dir", type=Path, default=None, help="default runs/bench-chaos-<time>")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md",
                   help="markdown file the section is appended to ('-': none, e.g. for a try-out)")
    p.add_argument("--timeout-s", type=float, default=5400.0, help="the run is stopped cleanly after it")
    p.add_argument("--reuse", action="store_true", help="start nothing: report the run in --out-dir again")
    args = p.parse_args(argv)
    try:
        args.faults = parse_faults(args.faults)
        args.extra = check_extras(args.extra, RESERVED)
    except ValueError as e:
        p.error(str(e))
    for flag, value in (("--actors", args.actors), ("--learner-ranks", args.learner_ranks), ("--steps", args.steps)):
        if value < 1:
            p.error(f"{flag} {value}: must be at least 1")
    for flag, value in (("--kill-every-s", args.kill_every_s), ("--stuck-s", args.stuck_s),
                        ("--join-stall-s", args.join_stall_s), ("--env-timeout-s", args.env_timeout_s)):
        if value <= 0:
            p.error(f"{flag} {value}: must be positive")
    args.out_dir = (args.out_dir or ROOT / "runs" / f"bench-chaos-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if args.reuse and not (args.out_dir / "result.json").is_file():
        p.error(f"--reuse: no {args.out_dir / 'result.json'}: pass the --out-dir of an earlier chaos run")
    if not args.reuse and (args.out_dir / "run").exists():
        p.error(f"--out-dir {args.out_dir} already holds a run: pass --reuse to report it again, or another --out-dir")
    return args


def main() -> None:
    args = arguments()
    out = args.out_dir
    run_dir, log_path, faults_path, result_path = out / "run", out / "run.log", out / "kills.jsonl", out / "result.json"
    command = "python bench/chaos/chaos.py " + shlex.join(sys.argv[1:])
    if not args.reuse:
        out.mkdir(parents=True, exist_ok=True)
        plan = FaultPlan(args.kill_every_s, args.seed, frozenset(args.faults), args.stuck_s, args.startup_within_s,
                         args.join_stall_s)
        monkey = Monkey(run_dir, log_path, plan, faults_path)
        load_before, start = load_average(), time.time()
        monkey.start()
        try:
            res = run_algo_train("chaos", "grpo", run_dir, overrides(args), log_path, timeout_s=args.timeout_s)
        finally:
            monkey.done.set()
            monkey.join()
        result_path.write_text(json.dumps({"rc": res.rc, "wall_s": res.seconds, "error": res.error, "command": command,
                                           "load": [load_before, load_average()], "kill_every_s": args.kill_every_s,
                                           "faults": args.faults, "start_epoch": start,
                                           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    saved = json.loads(result_path.read_text())
    faults = load_faults(faults_path)
    rep = analyse(run_dir, log_path.read_text(errors="replace"), faults, saved["rc"], saved["wall_s"],
                  saved.get("start_epoch"))
    text = section(rep, faults, saved)
    print(json.dumps(rep, default=list))
    log(text)
    if str(args.results) != "-":
        with open(args.results, "a") as f:
            f.write("\n" + text)
        log(f"[chaos] appended to {args.results}")


if __name__ == "__main__":
    main()
