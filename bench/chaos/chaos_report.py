"""The chaos bench's report (bench/chaos/chaos.py): the run's totals and ledger check, and the per-fault table.

Per fault: its kind, victim and time; the restart the run's console reports for it (`chaos_console`: the
restart line naming the killed pid, or for a stuck engine core its actor's pid), with the time that line
gives; and the learner's idle time around it: the largest gap between consecutive learner steps (progress
lines, `chaos_console.step_times`) from the fault until the run is back to training, i.e. over the gaps that end
after the fault and begin before the first step at or after the fault's end (the fault's time plus the
restart's, plus the stop of a stuck engine core); a gap begun before the fault counts whole (the learner idled
through it), and with no step before the fault the first gap counts from the fault; a gap is cut at the next
fault, and none after it counts (the next fault's effects are its own). Beside it, the typical gap:
the median of the gaps no fault's span touches, so the idle figure can be read against it.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from collections import Counter
from pathlib import Path

from bench.chaos.chaos_audit import audit, held_keys, shard_walks, train_prompts
from bench.chaos.chaos_console import Restart, restart_events, restarts, step_times
from bench.chaos.chaos_monkey import ROLES

WHAT = {"kill": "SIGKILL", "startup": "SIGKILL at start-up", "drain": "SIGKILL in the final drain/checkpoint",
        "snapshot": "SIGKILL of the buffer mid-snapshot", "stuck": "SIGSTOP of an engine core",
        "join": "SIGKILL of an actor, its successor's engine core SIGSTOPped in the weight-sync join"}


def load_faults(path: Path) -> list[dict]:
    """The faults of a faults file (`chaos_monkey.Monkey`), each stuck or join one with its SIGCONT record as
    "cont", each join one with its successor's SIGSTOP as "held"; lines of the bench before its fault kinds (no
    "kind") are SIGKILLs."""
    faults: list[dict] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec.get("kind") in ("cont", "held"):
            faults[rec["of"]][rec["kind"]] = rec
        else:
            faults.append({"kind": "kill"} | rec)
    return faults


def idle_around(steps: list[float], fault: float, until: float,
                next_fault: float | None = None) -> tuple[float, float, float, bool] | None:
    """(largest gap, span start, span end, cut) of the learner steps around a fault at `fault` whose effects last
    until `until` (module docstring); None when no step follows it. A gap is cut at `next_fault`, the time of
    the fault after it (`cut`: this happened), whose effects are its own."""
    later = sorted(t for t in steps if t > fault)
    if not later:
        return None
    start = max((t for t in steps if t <= fault), default=fault)
    end = next((t for t in later if t >= until), later[-1])
    cap = float("inf") if next_fault is None else next_fault
    gaps, prev = [], start
    for t in later:
        if t > end or prev >= cap:
            break
        gaps.append(min(t, cap) - prev)
        prev = t
    return max(gaps), start, end, end > cap


def typical_gap(steps: list[float], spans: list[tuple[float, float]]) -> float | None:
    """Median gap between consecutive steps over the gaps no fault's span touches; None when none is left."""
    ts = sorted(steps)
    gaps = [b - a for a, b in zip(ts, ts[1:]) if not any(b > s0 and a < s1 for s0, s1 in spans)]
    return statistics.median(gaps) if gaps else None


def fault_rows(faults: list[dict], events: list[Restart], steps: list[float]) -> tuple[list[dict], float | None]:
    """Per fault: kind, victim, time, the restart the console reports for it, the learner's idle time around
    it (module docstring); and the typical step gap outside the faults."""
    unused, rows, spans = list(events), [], []
    times = [f.get("epoch") for f in faults]
    for k, f in enumerate(faults):
        pid = f.get("actor_pid", f["pid"])
        restart = next((e for e in unused if e.role == f["role"] and e.pid == pid), None)
        if restart is not None:
            unused.remove(restart)
        row = {"kind": f["kind"], "victim": f"{f['name']} (pid {f['pid']})", "t_s": f.get("t_s"),
               "restarted": restart is not None, "restart_s": restart.seconds if restart else None, "idle_s": None,
               "no_step_before": False, "cut": False}
        if "epoch" in f:
            until = f["epoch"] + (f.get("stuck_s") or 0) + (row["restart_s"] or 0)
            later = [t for t in times[k + 1:] if t is not None and t >= f["epoch"]]
            found = idle_around(steps, f["epoch"], until, min(later, default=None))
            if found is not None:
                row["idle_s"], s0, s1, row["cut"] = found
                row["no_step_before"] = s0 == f["epoch"]
                spans.append((s0, s1))
        row["note"] = _note(f)
        rows.append(row)
    return rows, typical_gap(steps, spans)


def _note(f: dict) -> str:
    if f["kind"] == "startup":
        return f.get("phase", "")
    if f["kind"] == "drain":
        return "after the last step's progress line" + (f": {f['phase']}" if f.get("phase") else "")
    if f["kind"] == "snapshot":
        landed = ("the snapshot still missing right after the kill" if f.get("landed") else
                  "the snapshot was complete by the kill")
        return f"{f.get('window', '')}; {landed}"
    if f["kind"] == "stuck":
        cont = f.get("cont")
        after = ("no SIGCONT recorded" if cont is None else
                 "SIGCONT sent then" if cont["sent"] else "gone before its SIGCONT")
        return f"stopped for {f['stuck_s']:.0f} s: {after}"
    if f["kind"] == "join":
        held, cont = f.get("held"), f.get("cont")
        if held is None or held.get("missed"):
            return "missed: no successor engine came up to hold in the join"
        if held.get("late"):
            return f"too late: the successor had joined before its engine core pid {held['pid']} was stopped; let go"
        after = "no SIGCONT recorded" if cont is None else f"SIGCONT {cont['epoch'] - held['epoch']:.0f} s later"
        return (f"successor engine core pid {held['pid']} SIGSTOPped {held['epoch'] - f['epoch']:.0f} s after the "
                f"kill, as it entered the join; {after}")
    return ""


def fault_table(rows: list[dict], typical: float | None) -> str:
    def restart(r):
        if not r["restarted"]:
            return "none reported"
        return "– (its line gives no time)" if r["restart_s"] is None else f"{r['restart_s']:.0f} s"

    def idle(r):
        if r["idle_s"] is None:
            return "– (no step after it)"
        ratio = f" ({r['idle_s'] / r['restart_s']:.2f}× the restart)" if r["restart_s"] else ""
        return (f"{r['idle_s']:.0f} s{ratio}" + (" from the fault (no step before it)" if r["no_step_before"] else "")
                + (", up to the next fault" if r["cut"] else ""))

    lines = ["| # | fault | victim | at | restart (the run's line) | learner idle (largest step gap) | note |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {i} | {WHAT[r['kind']]} | {r['victim']} | {r['t_s']} s | {restart(r)} | {idle(r)} | {r['note']} |"
              for i, r in enumerate(rows, 1)]
    lines += ["", "Typical step gap outside the faults (median): " + ("–" if typical is None else f"{typical:.0f} s")
              + " (step times from the console's progress lines, 1 s resolution)."]
    return "\n".join(lines)


def analyse(run_dir: Path, console: str, faults: list[dict], rc: int | None, wall_s: float | None,
            start_epoch: float | None) -> dict:
    from configs.loading import resolve_saved
    from learner.committed import committed_steps
    from tests.e2e.helpers import ledger_state

    cfg = resolve_saved(run_dir / "config.yaml")
    said = restarts(console)
    kills = [f for f in faults if f["kind"] != "stuck"]  # a join fault's first part is an actor's SIGKILL
    rows, typical = fault_rows(faults, restart_events(console), step_times(console, start_epoch) if start_epoch else [])
    rep = {"exit": rc, "wall_s": wall_s, "steps_asked": cfg.learner.steps, "kills": Counter(k["role"] for k in kills),
           "fault_kinds": Counter(f["kind"] for f in faults), "faults": rows, "typical_gap_s": typical,
           "restarts": {role: len(pids) for role, pids in said.items()}, "resumes_recorded": len(cfg.resumed),
           "unanswered_kills": [k for k in kills if k["pid"] not in said[k["role"]]], "batch_prompts":
           cfg.learner.batch_prompts, "actors": cfg.rollout.num_actors, "learner_ranks": cfg.learner.world_size}
    rep["unexplained_actor_restarts"] = unexplained_actor_restarts(said["actor"], faults)
    rep["env"] = env_counts(run_dir / "metrics.jsonl") if cfg.env.enabled else None
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


def unexplained_actor_restarts(dead: list[int], faults: list[dict]) -> list[int]:
    """Pids of restarted actors (`dead`, from the console) that no fault hit: live engines replaced. Hit are an
    actor SIGKILLed, the actor of a stuck engine core (replaced by design), and a join fault's held successor
    (the one stalled in the join: blaming it is the point of the rebuild's deadline)."""
    hit = {f.get("actor_pid", f["pid"]) for f in faults if f["role"] == "actor"}
    hit |= {f["held"]["actor_pid"] for f in faults if "actor_pid" in f.get("held", {})}
    return [pid for pid in dead if pid not in hit]


def env_counts(metrics: Path) -> dict[str, int]:
    """env/trajectories, env/errors and env/timeouts of the run's last metrics row that has them: counts summed
    over the live actors since they started (docs/metrics.md), so a replaced actor's part is not in them."""
    out = {"env/trajectories": 0, "env/errors": 0, "env/timeouts": 0}
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if row.get("env/trajectories") is not None:
                out = {key: int(row.get(key) or 0) for key in out}
    return out


def goal_met(rep: dict) -> bool:
    a = rep.get("audit")
    return (rep["exit"] == 0 and rep["steps_done"] == rep["steps_asked"] and a is not None and rep["drained"]
            and not (a["lost"] or a["twice"] or a["trained_and_held"] or a["foreign"])
            and a["trained"] == rep["steps_done"] * rep["batch_prompts"]
            and not (rep["fault_kinds"].get("join") and rep.get("unexplained_actor_restarts")))


def table(rep: dict) -> str:
    per = " / ".join
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(rep["fault_kinds"].items())) or "none"
    rows = [("exit status", rep["exit"]),
            ("steps completed / asked (final checkpoint)", f"{rep['steps_done']} / {rep['steps_asked']}"),
            ("wall time, start-up and restarts included", f"{rep['wall_s'] / 60:.1f} min" if rep["wall_s"] else "?"),
            ("faults by kind", kinds),
            ("SIGKILLs: actor / buffer / learner rank", per(str(rep["kills"].get(r, 0)) for r in ROLES)),
            ("restarts the run reported: actor / buffer / learner", per(str(rep["restarts"][r]) for r in ROLES)),
            ("learner resumes in config.yaml `resumed`", rep["resumes_recorded"]),
            ("kills no restart line names", len(rep["unanswered_kills"])),
            ("actor restarts no actor fault explains (live engines replaced)",
             ", ".join(f"pid {p}" for p in rep["unexplained_actor_restarts"]) or 0
             if "unexplained_actor_restarts" in rep else "?")]
    if rep.get("env") is not None:
        e, n = rep["env"], max(rep["env"]["env/trajectories"], 1)
        rows.append(("env/errors / env/timeouts of env/trajectories (the live actors', since they started)",
                     f"{e['env/errors']} ({e['env/errors'] / n:.1%}) / {e['env/timeouts']} "
                     f"({e['env/timeouts'] / n:.1%}) of {e['env/trajectories']}"))
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
    rows.append(("goal: completes, 0 lost, 0 twice" + (", no live engine replaced" if rep["fault_kinds"].get("join")
                                                        else ""), "**met**" if goal_met(rep) else "**missed**"))
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def section(rep: dict, faults: list[dict], saved: dict) -> str:
    """The markdown section for bench/RESULTS.md (`saved`: result.json of the run)."""
    every, kinds = saved["kill_every_s"], saved.get("faults", ["kill"])
    listed = "; ".join(f"{f['t_s']} s {f['name']} (pid {f['pid']}, {f['kind']})" for f in faults) or "none"
    missing = "; ".join(f"{k['name']} pid {k['pid']} at {k['t_s']} s" for k in rep["unanswered_kills"])
    head = (f"a random role SIGKILLed every ~{every:.0f} s" if kinds == ["kill"] else
            f"faults ({', '.join(kinds)}) every ~{every:.0f} s")
    return "\n".join([
        f"## Chaos (`bench/chaos/chaos.py`) — {head} of a {rep['steps_asked']}-step quick-start, {saved['when']}", "",
        f"What it measures: whether the quick-start (`grpo`, tiny model, {rep['actors']} actors, "
        f"{rep['learner_ranks']} learner rank(s), `max_restarts`, checkpoints every few steps) finishes while its "
        f"processes are hit (faults: {', '.join(kinds)}; bench/chaos/chaos.py's docstring says what each is), every "
        f"~{every:.0f} s of training, victims drawn by a seeded RNG; how many restarts the run reported per role and "
        "how long the learner idled around each fault; and from the final checkpoint's ledger and buffer snapshot "
        "against a re-walk of each actor's shard: prompts lost (before the shard's last settled prompt, yet "
        "neither trained, discarded nor held) and prompts trained twice. The gap between periodic faults is "
        "counted in training time (seconds with a step finished within the last 5 s and a checkpoint to resume "
        f"from), so restarts do not eat into it. Machine: {os.cpu_count()} cores, shared; 1-minute load average "
        f"{saved['load'][0]} before, {saved['load'][1]} after.", "",
        f"Command: `{saved['command']}`", "", table(rep), "",
        "Per fault (learner idle: the largest gap between consecutive learner steps from the fault until the run is "
        "back to training; bench/chaos/chaos_report.py):", "", fault_table(rep["faults"], rep["typical_gap_s"]), "",
        f"Faults (seconds after start): {listed}.",
        *([f"Kills no restart line names: {missing}."] if missing else []), ""])
