"""`algo-train scale RUN_DIR --actors N`: ask a live run for N actors; it adds or removes actors without
stopping (`launch.state.scaling` says how the run answers, and why the request is a file in RUN_DIR).

Refused, with the fix, before anything is written: a folder that holds no run, a run that has finished
(its summary.json), and a run whose driver is gone (its processes.json names a pid on this host that no
longer runs: `--resume RUN_DIR --actors N` continues it with N). With `--wait S` the command waits up to S
seconds for the run to say (in processes.json) that it has N actors.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

from launch.state.scaling import write_request


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="algo-train scale", description=(
        "Ask a live run for N actors. It adds or removes actors without stopping: new actors start while it "
        "trains; every actor then delivers what it has in flight and takes a new shard of the prompts, so "
        "every prompt is still trained exactly once. The run's console says when they have joined or left."))
    p.add_argument("run_dir", metavar="RUN_DIR", help="the live run's folder (its --output)")
    p.add_argument("--actors", type=int, required=True, metavar="N", help="the actor count to go to (>= 1)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds until the run has N actors (default: ask and return)")
    return p


def live_run_problem(run_dir: Path) -> str | None:
    """Why `run_dir` holds no live run to scale (one line with the fix), or None."""
    processes = run_dir / "processes.json"
    if (run_dir / "summary.json").is_file():
        return f"{run_dir} has finished (summary.json): start a new run, or `algo-train --resume {run_dir} --steps N`"
    if not processes.is_file():
        return f"{run_dir} holds no running run (no processes.json): pass the --output folder of a live run"
    driver = json.loads(processes.read_text()).get("driver", {})
    if driver.get("host") == socket.gethostname() and not _alive(driver.get("pid")):
        return (f"the run at {run_dir} is not running (its driver, pid {driver.get('pid')}, is gone): "
                f"`algo-train --resume {run_dir} --actors N` continues it with N actors")
    return None


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def actors_now(run_dir: Path) -> int:
    """The live actors the run's processes.json lists."""
    return sum(1 for role in json.loads((run_dir / "processes.json").read_text()) if role.startswith("actor/"))


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if args.actors < 1:
        print(f"algo-train scale: --actors {args.actors}: a run needs at least 1 actor")
        return 2
    if problem := live_run_problem(run_dir):
        print(f"algo-train scale: {problem}")
        return 2
    write_request(run_dir, args.actors)
    print(f"[scale] asked the run at {run_dir} for {args.actors} actors (it lists {actors_now(run_dir)}); its "
          "console says when they have joined or left")
    deadline = time.monotonic() + args.wait
    while args.wait and time.monotonic() < deadline:
        if actors_now(run_dir) == args.actors:
            print(f"[scale] the run has {args.actors} actors")
            return 0
        time.sleep(1.0)
    if args.wait:
        print(f"[scale] the run did not list {args.actors} actors within {args.wait:g} s (its console says why)")
        return 1
    return 0
