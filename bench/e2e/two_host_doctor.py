"""`algo-train doctor` on two hosts (issue 31, N1 of reviews/gpu_path_2.md): the learner on host A, one actor
on host B, and the doctor's rows, PASS/WARN/FAIL each.

Why: N1 was a run that failed only on a cluster — a learner of one rank pinned GLOO_SOCKET_IFNAME /
NCCL_SOCKET_IFNAME to loopback in the process that then hosts the weight sync, so an engine on another host
could not join — and a doctor that passed it (its weight check never ran the learner's rendezvous). The
doctor must FAIL where the run would; this shows it on two real hosts: `tests.cluster.netns` (two network
namespaces joined by a veth pair, a Ray head on A and a Ray worker on B, no *_SOCKET_IFNAME exported), the
learner placed on A (`learner.custom_resources={"hostA": 1}`) and the actors on B
(`rollout.custom_resources={"hostB": 1}`), the built-in tiny model.

`--tree DIR` runs the doctor of another source tree (e.g. `git archive <commit> | tar -x -C DIR`): every
process of the check imports that tree's code (PYTHONPATH of the Ray nodes and of the doctor, started in
DIR); the harness is this checkout's. Needs root (namespaces) and ~2-4 min on a 2-core machine (one vLLM
CPU engine). Everything it starts is stopped by pid and the namespaces are deleted (`TwoHosts.close`).

    .venv/bin/python bench/e2e/two_host_doctor.py [--tree DIR] [--json OUT]

Prints the doctor's table as it printed it, then one line per row: `STATUS  where  check  found`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.cluster import netns  # noqa: E402

# Which file of the learner's code a Ray worker on each host imports, asked from `tree` as the doctor is started
# (a check of the set-up, not of the doctor): {"A": path, "B": path}.
WHICH = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def which():
    import learner.distributed
    return learner.distributed.__file__

print(json.dumps({h: ray.get(which.options(resources={f"host{h}": 0.001}).remote()) for h in "AB"}))
"""


def doctor_argv(hosts: netns.TwoHosts, tree: Path, work: Path) -> list[str]:
    """The doctor's command on A, run from `tree` (so `-m launch.cli` and Ray's workers import it)."""
    return ["sh", "-c", 'cd "$0" && exec "$@"', str(tree), sys.executable, "-m", "launch.cli", "doctor",
            "--algo", "grpo", "--ray-address", hosts.head_address,
            "--set", f"logging.output_dir={work / 'runs'}", "--set", f"model.cache_dir={work / 'models'}",
            "--set", 'learner.custom_resources={"hostA": 1}', "--set", 'rollout.custom_resources={"hostB": 1}',
            "--json", str(work / "rows.json")]


def table_lines(log: str) -> list[str]:
    """The doctor's table as printed: from its header line to its count line."""
    lines = log.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("where ") and " check " in ln), None)
    if start is None:
        return []
    end = next((i for i in range(start, len(lines)) if " checks: " in lines[i]), len(lines) - 1)
    return lines[start:end + 1]


def run(tree: Path, timeout_s: float) -> dict:
    reason = netns.unavailable()
    if reason:
        raise SystemExit(f"two_host_doctor: {reason}")
    work = Path(tempfile.mkdtemp(prefix="two-host-doctor-", dir="/tmp"))  # shared by both hosts (one filesystem)
    os.environ["PYTHONPATH"] = str(tree)  # read by netns.start: the Ray nodes (and their workers) import `tree`
    t0 = time.monotonic()
    hosts = netns.start()
    out: dict = {"tree": str(tree), "cluster_up_s": round(hosts.startup_s, 1)}
    try:
        env = hosts.env_of("A") | {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(tree)}
        which = hosts.run("A", "sh", "-c", 'cd "$0" && exec "$@"', str(tree), sys.executable, "-c", WHICH,
                          hosts.head_address, timeout=180, env=env)
        out["imports"] = json.loads(which.stdout.strip().splitlines()[-1])
        argv = doctor_argv(hosts, tree, work)
        out["command"] = " ".join(argv[4:])
        proc = hosts.popen("A", *argv, log=work / "doctor.log", env=env)
        try:
            out["exit"] = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            out["exit"] = f"timed out after {timeout_s:.0f} s"
        log = (work / "doctor.log").read_text(errors="replace")
        out["table"] = table_lines(log)
        out["rows"] = json.loads((work / "rows.json").read_text()) if (work / "rows.json").exists() else []
        if not out["rows"]:
            out["log_tail"] = log[-4000:]
    finally:
        hosts.close()  # every process in either namespace, by pid; then the namespaces
        shutil.rmtree(work, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=str(REPO), help="the source tree whose doctor runs (default: this checkout)")
    ap.add_argument("--json", help="also write the outcome (rows, table, timings) to this file")
    ap.add_argument("--timeout", type=float, default=600, help="seconds the doctor may take")
    args = ap.parse_args(argv)
    tree = Path(args.tree).resolve()
    if not (tree / "launch" / "cli.py").is_file():
        print(f"two_host_doctor: --tree {tree} is not a source tree of this project (no launch/cli.py)", file=sys.stderr)
        return 2
    out = run(tree, args.timeout)
    print("\n".join(out["table"]) or out.get("log_tail", ""))
    print(f"\n[two-host doctor] tree {tree}: imports on A/B {out['imports']}; exit {out['exit']}; "
          f"cluster up in {out['cluster_up_s']} s, {out['seconds']} s in all")
    for r in out["rows"]:
        print(f"{r['status']:<5} {r['where']:<12} {r['name']:<16} {r['found'][:160]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
