"""Chaos, measured (issue 23 item 5): does a run survive its processes being SIGKILLed, and does it still
train every prompt exactly once?

What it does: runs the quick-start (`algo-train --algo grpo`, the built-in tiny model, 2 vLLM actors) with
`max_restarts` and checkpoints every `--save-every` steps, and kills one of its processes with SIGKILL (as
the OOM killer would) after every ~`--kill-every-s` seconds of training (each gap drawn uniformly from
0.5-1.5 times it; a second counts while the run trains, i.e. has finished a step within the last 5 s, and
has a committed checkpoint to resume from: restarts and evaluations do not count, so the run trains
between kills however long its restarts take; no kill after the last step's progress line). The victim is drawn with a seeded RNG: first the role
(an actor, the buffer, a learner rank; equally likely), then which actor or rank; its pid comes from the
run folder's processes.json (rewritten by the run after each restart) and must be alive in the run's
session.

What it measures (the report, and a section appended to bench/RESULTS.md):
- completion: the exit status, the steps the final checkpoint holds against the steps asked;
- restarts per role, from the run's own console lines ("[actor] actor i ... restarted as",
  "[buffer] the buffer process ... restarted as", "[learner] ... restart k of N") and config.yaml's
  `resumed` record, beside the kills that caused them;
- prompts lost or trained twice, from the final checkpoint's prompt ledger (`launch.state.ledger`: every
  (epoch, prompt) trained, with its step, and those the buffer discarded) and its buffer snapshot (the
  groups held), against a re-walk of each actor's shard made here from the data and the config (the
  actors' documented order, `actors/prompts.py`: actor a of N owns prompts a, a+N, ...; each epoch over
  the shard shuffled with random.Random(f"{seed}/{a}/{epoch}")). The run drains its actors into the buffer
  before the final checkpoint, so everything before the last settled prompt of a shard (its frontier)
  must be trained, discarded or held: any other prompt there is *lost*. *Twice*: an (epoch, prompt) the
  ledger lists more than once; also counted: trained prompts the buffer still holds (a resume would
  serve them again), settled keys that are in no shard's walk, and trained prompts against
  steps × learner.batch_prompts.

    python bench/chaos.py                                # the quick-start's 350 steps: 20-35 min on 2 cores
    python bench/chaos.py --steps 60 --kill-every-s 30   # a short try-out
    python bench/chaos.py --reuse --out-dir DIR          # report an earlier run again, starting nothing

The goal (issue 23): the run completes, 0 lost, 0 trained twice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.runs import load_average, log, run_algo_train  # noqa: E402

Key = tuple[int, int]  # (epoch, prompt_index)
ROLES = ("actor", "buffer", "learner")
STALL_S = 5.0  # seconds without a new step after which the run counts as not training (restarting, evaluating)
STEP_LINE = re.compile(r"^\d\d:\d\d:\d\d step (\d+)/(\d+) ", re.M)  # a plain progress line: one per step
RESTART_LINES = {  # the run's own line for each restart it made
    "actor": re.compile(r"^\[actor\] actor \d+ \(pid (\d+) .*; restarted as pid", re.M),
    "buffer": re.compile(r"^\[buffer\] the buffer process \(pid (\d+) .*; restarted as pid", re.M),
    "learner": re.compile(r"^\[learner\] (?:.*\(pid (\d+) .*)?restart \d+ of \d+: resuming", re.M),
}


# ---------------------------------------------------------------------------------------------- the audit
def shard_walks(prompts: Sequence[int], actors: int, seed: int, epochs: int) -> list[list[Key]]:
    """Each actor's walk over its shard for `epochs` epochs: the (epoch, prompt_index) in the order the
    actor hands them out (module docstring), written here from the documented rule, not the actors' code."""
    walks = []
    for a in range(actors):
        shard = list(prompts[a::actors])
        walk: list[Key] = []
        for e in range(epochs):
            order = list(range(len(shard)))
            random.Random(f"{seed}/{a}/{e}").shuffle(order)
            walk += [(e, shard[j]) for j in order]
        walks.append(walk)
    return walks


@dataclass
class Audit:
    trained: int
    discarded: int
    held: int
    lost: list[Key] = field(default_factory=list)  # before its shard's frontier, neither trained, discarded nor held
    twice: list[Key] = field(default_factory=list)  # listed more than once as trained
    trained_and_held: list[Key] = field(default_factory=list)  # trained, yet still in the buffer
    foreign: list[Key] = field(default_factory=list)  # settled, but in no shard's walk
    frontiers: list[int] = field(default_factory=list)  # per shard: walk positions up to its last settled prompt


def audit(walks: Sequence[Sequence[Key]], trained: Iterable[Key], discarded: Iterable[Key],
          held: Iterable[Key]) -> Audit:
    """Lost and twice-trained prompts of a finished run (module docstring)."""
    counts = Counter(map(tuple, trained))
    discarded, held = set(map(tuple, discarded)), set(map(tuple, held))
    settled = set(counts) | discarded | held
    out = Audit(sum(counts.values()), len(discarded), len(held),
                twice=sorted(k for k, c in counts.items() if c > 1), trained_and_held=sorted(held & set(counts)))
    for walk in walks:
        frontier = max((i + 1 for i, k in enumerate(walk) if k in settled), default=0)
        out.frontiers.append(frontier)
        out.lost += [k for k in walk[:frontier] if k not in settled]
    out.foreign = sorted(settled - {k for walk in walks for k in walk})
    return out


def restarts(console: str) -> dict[str, list[int]]:
    """Per role, the pids the run's console lines say died and were restarted (0 when a line names none)."""
    return {role: [int(p or 0) for p in rx.findall(console)] for role, rx in RESTART_LINES.items()}


# ---------------------------------------------------------------------------------------------- the chaos
def alive_in(pid: int, session: int) -> bool:
    try:
        return os.getsid(pid) == session and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Monkey(threading.Thread):
    """Kills a random role of the run every ~`every_s` seconds (module docstring) until `done` is set."""

    def __init__(self, run_dir: Path, log_path: Path, every_s: float, seed: int, kills_path: Path):
        super().__init__(daemon=True)
        self.run_dir, self.log_path, self.every_s, self.kills_path = run_dir, log_path, every_s, kills_path
        self.rng, self.done, self.kills = random.Random(seed), threading.Event(), []

    def steps_seen(self) -> tuple[int, bool]:
        """(progress lines so far, whether the last one is the run's last step)."""
        try:
            lines = STEP_LINE.findall(self.log_path.read_text(errors="replace"))
        except OSError:
            return 0, False
        return len(lines), bool(lines) and lines[-1][0] == lines[-1][1]

    def run(self) -> None:
        from learner.committed import committed_steps

        t0 = last = time.monotonic()
        gap, trained_s, seen_before, moved_at = self._gap(), 0.0, 0, None
        while not self.done.wait(1.0):
            now, (seen, last_step) = time.monotonic(), self.steps_seen()
            if last_step:  # the run is finishing (drain, evaluation, final checkpoint): no more kills
                return
            if seen > seen_before:
                seen_before, moved_at = seen, now
            if moved_at is not None and now - moved_at < STALL_S and committed_steps(self.run_dir / "checkpoints"):
                trained_s += now - last  # the run is training (a step within STALL_S), and can be resumed
            last = now
            if trained_s < gap:
                continue
            try:
                roles = json.loads((self.run_dir / "processes.json").read_text())
            except (OSError, ValueError):
                continue
            role = self.rng.choice(ROLES)
            name = self.rng.choice(sorted(r for r in roles if r.split("/")[0] == role))
            pid, session = int(roles[name]["pid"]), _session(roles)
            if session is None or not alive_in(pid, session):  # processes.json not yet rewritten: next second
                continue
            os.kill(pid, signal.SIGKILL)
            kill = {"t_s": round(time.monotonic() - t0), "role": role, "name": name, "pid": pid,
                    "steps_seen": seen}
            self.kills.append(kill)
            with open(self.kills_path, "a") as f:
                f.write(json.dumps(kill) + "\n")
            log(f"[chaos] {kill['t_s']:5d} s: SIGKILL {name} (pid {pid}) after {seen} progress lines")
            gap, trained_s, moved_at = self._gap(), 0.0, None

    def _gap(self) -> float:
        return self.every_s * self.rng.uniform(0.5, 1.5)


def _session(roles: dict) -> int | None:
    """The run's session: the driver's (launch.commands.supervisor starts the run in a session of its own)."""
    try:
        return os.getsid(int(roles["driver"]["pid"]))
    except (KeyError, ValueError, OSError):
        return None


# ---------------------------------------------------------------------------------------------- the report
def held_keys(snapshot: Path) -> list[Key]:
    """(epoch, prompt) of every group a buffer snapshot holds (read by the buffer's own restore)."""
    from buffer.core import BufferCore
    from buffer.settings import BufferSettings
    from buffer.snapshot import restore_snapshot

    core = BufferCore(BufferSettings())
    restore_snapshot(core, str(snapshot))
    return [g.key for g in core.queue]


def train_prompts(cfg, tokenizer_dir: Path) -> list[int]:
    """prompt_index of every training prompt the run's actors share out (over-long ones are skipped)."""
    from actors.prompts import items_from_records, load_tokenizer
    from launch.prep.data import load_prompt_records

    records, _ = load_prompt_records(cfg)
    items, _ = items_from_records(records, load_tokenizer(str(tokenizer_dir)), cfg.data.max_prompt_tokens)
    return [it.prompt_index for it in items]


def analyse(run_dir: Path, console: str, kills: list[dict], rc: int | None, wall_s: float | None) -> dict:
    from configs.loading import resolve_saved
    from learner.committed import committed_steps
    from tests.e2e.helpers import ledger_state

    cfg = resolve_saved(run_dir / "config.yaml")
    said = restarts(console)
    rep = {"exit": rc, "wall_s": wall_s, "steps_asked": cfg.learner.steps, "kills": Counter(k["role"] for k in kills),
           "restarts": {role: len(pids) for role, pids in said.items()}, "resumes_recorded": len(cfg.resumed),
           "unanswered_kills": [k for k in kills if k["pid"] not in said[k["role"]]], "batch_prompts":
           cfg.learner.batch_prompts}
    found = committed_steps(run_dir / "checkpoints")
    rep["steps_done"] = found[-1][0] if found else 0
    if not found:
        return rep
    ckpt = found[-1][1]
    state = ledger_state(run_dir, rep["steps_done"])
    extra = json.loads((ckpt / "extra_state.json").read_text())
    trained = list(zip(state["epochs"], state["prompts"]))
    discarded = [tuple(k) for k in state.get("discarded", [])]
    held = held_keys(ckpt / extra["buffer_snapshot"])
    epochs = 1 + max(e for e, _ in [*trained, *discarded, *held, (0, 0)])
    walks = shard_walks(train_prompts(cfg, ckpt / "hf_config"), cfg.rollout.num_actors, cfg.seed, epochs)
    rep["audit"] = audit(walks, trained, discarded, held).__dict__
    summary = run_dir / "summary.json"  # written after the final checkpoint, which follows the actors' drain
    rep["drained"] = summary.exists() and json.loads(summary.read_text()).get("step") == rep["steps_done"]
    return rep


def goal_met(rep: dict) -> bool:
    a = rep.get("audit")
    return (rep["exit"] == 0 and rep["steps_done"] == rep["steps_asked"] and a is not None and rep["drained"]
            and not (a["lost"] or a["twice"] or a["trained_and_held"] or a["foreign"])
            and a["trained"] == rep["steps_done"] * rep["batch_prompts"])


def table(rep: dict) -> str:
    per = " / ".join
    rows = [("exit status", rep["exit"]),
            ("steps completed / asked (final checkpoint)", f"{rep['steps_done']} / {rep['steps_asked']}"),
            ("wall time, start-up and restarts included", f"{rep['wall_s'] / 60:.1f} min" if rep["wall_s"] else "?"),
            ("SIGKILLs: actor / buffer / learner rank", per(str(rep["kills"].get(r, 0)) for r in ROLES)),
            ("restarts the run reported: actor / buffer / learner", per(str(rep["restarts"][r]) for r in ROLES)),
            ("learner resumes in config.yaml `resumed`", rep["resumes_recorded"]),
            ("kills no restart line names", len(rep["unanswered_kills"]))]
    a = rep.get("audit")
    if a:
        want = rep["steps_done"] * rep["batch_prompts"]
        rows += [("prompts trained (ledger) / steps × batch_prompts", f"{a['trained']} / {want}"),
                 ("discarded by the buffer / held at the end", f"{a['discarded']} / {a['held']}"),
                 ("shard frontiers (walk positions)", per(map(str, a["frontiers"]))),
                 ("**lost** (before a frontier, not settled)", len(a["lost"]) if rep["drained"] else
                  f"not known: the last checkpoint is a periodic one, not the drained final one; {len(a['lost'])} "
                  "prompts open there (in flight then: a resume generates them)"),
                 ("**trained twice**", len(a["twice"])),
                 ("trained yet still held by the buffer", len(a["trained_and_held"])),
                 ("settled but in no shard's walk", len(a["foreign"]))]
    rows.append(("goal: completes, 0 lost, 0 twice", "**met**" if goal_met(rep) else "**missed**"))
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def section(rep: dict, kills: list[dict], command: str, load: tuple, when: str) -> str:
    listed = "; ".join(f"{k['t_s']} s {k['name']} (pid {k['pid']})" for k in kills) or "none"
    missing = "; ".join(f"{k['name']} pid {k['pid']} at {k['t_s']} s" for k in rep["unanswered_kills"])
    return "\n".join([
        f"## Chaos (`bench/chaos.py`) — a random role SIGKILLed every ~{rep['kill_every_s']:.0f} s of a "
        f"{rep['steps_asked']}-step quick-start, {when}", "",
        "What it measures: whether the quick-start (`grpo`, tiny model, 2 actors, `max_restarts`, checkpoints "
        "every few steps) finishes while one of its processes (an actor, the buffer or the learner rank, drawn "
        f"by a seeded RNG) is SIGKILLed every ~{rep['kill_every_s']:.0f} s, how many restarts the run reported per role, and "
        "from the final checkpoint's ledger and buffer snapshot against a re-walk of each actor's shard: "
        "prompts lost (before the shard's last settled prompt, yet neither trained, discarded nor held) and "
        "prompts trained twice. The gap between kills is counted in training time (seconds with a step finished "
        "within the last 5 s and a checkpoint to resume from), so restarts do not eat into it. "
        f"Machine: {os.cpu_count()} cores, shared; 1-minute load average {load[0]} before, {load[1]} after.", "",
        f"Command: `{command}`", "", table(rep), "",
        f"Kills (seconds after start): {listed}.",
        *([f"Kills no restart line names: {missing}."] if missing else []), ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=350, help="learner steps (the quick-start's: 20-35 min with the kills on 2 shared cores)")
    p.add_argument("--kill-every-s", type=float, default=60.0, help="mean seconds between kills")
    p.add_argument("--seed", type=int, default=0, help="seed of the victims' draw")
    p.add_argument("--max-restarts", type=int, default=40, help="learner restarts the run may make")
    p.add_argument("--save-every", type=int, default=10, help="learner.save_every (steps between checkpoints)")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE", help="more overrides of the run")
    p.add_argument("--out-dir", type=Path, default=None, help="default runs/bench-chaos-<time>")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md",
                   help="markdown file the section is appended to ('-': none)")
    p.add_argument("--timeout-s", type=float, default=5400.0, help="the run is stopped cleanly after it")
    p.add_argument("--reuse", action="store_true", help="start nothing: report the run in --out-dir again")
    args = p.parse_args()
    out = (args.out_dir or ROOT / "runs" / f"bench-chaos-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir, log_path, kills_path, result_path = out / "run", out / "run.log", out / "kills.jsonl", out / "result.json"
    command = "python bench/chaos.py " + shlex.join(sys.argv[1:])
    if not args.reuse:
        out.mkdir(parents=True, exist_ok=True)
        overrides = [f"learner.steps={args.steps}", f"max_restarts={args.max_restarts}",
                     f"learner.save_every={args.save_every}", *args.extra]
        monkey = Monkey(run_dir, log_path, args.kill_every_s, args.seed, kills_path)
        load_before = load_average()
        monkey.start()
        try:
            res = run_algo_train("chaos", "grpo", run_dir, overrides, log_path, timeout_s=args.timeout_s)
        finally:
            monkey.done.set()
            monkey.join()
        result_path.write_text(json.dumps({"rc": res.rc, "wall_s": res.seconds, "error": res.error, "command": command,
                                           "load": [load_before, load_average()], "kill_every_s": args.kill_every_s,
                                           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    saved = json.loads(result_path.read_text())
    kills = [json.loads(line) for line in kills_path.read_text().splitlines()] if kills_path.exists() else []
    rep = analyse(run_dir, log_path.read_text(errors="replace"), kills, saved["rc"], saved["wall_s"])
    rep["kill_every_s"] = saved["kill_every_s"]
    text = section(rep, kills, saved["command"], tuple(saved["load"]), saved["when"])
    print(json.dumps(rep, default=list))
    log(text)
    if str(args.results) != "-":
        with open(args.results, "a") as f:
            f.write("\n" + text)
        log(f"[chaos] appended to {args.results}")


if __name__ == "__main__":
    main()
