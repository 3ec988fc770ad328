"""GPU smoke check, the two-GPU part (reviews gpu_path_3.md, last section): what only a learner rank and an engine
on two GPUs of one machine can show, each step under its own timeout, all within `--budget` seconds (6 minutes),
one report in the format of bench/gpu/gpu_smoke.py (whose runner, table and import probe it uses).

Steps (bench/gpu/gpu_smoke_two_steps.py does the work; a step that needs what the machine lacks is skipped, saying why):
  imports          torch, CUDA, the devices, NCCL and vLLM (bench/gpu/gpu_smoke_imports.py)
  push             learner rank 0 on GPU 0, one TP-1 engine on GPU 1: NCCL connect, a dense and a delta push
  ring_connect     F6: where NCCL makes the broadcast ring's connections (NCCL_DEBUG=INFO of the push step)
  kill_rejoin      the engine killed mid-push: the push fails naming it; a new engine rejoins and serves
  stalled_rebuild  F1: a rebuild whose second rank never joins, with a request in flight under 3 s deadlines:
                   the engine's join ends when the learner gives up, the engine is not wedged
  async_aborts     (e): samples aborted mid-decode under async scheduling; the engine keeps stepping

    python bench/gpu/gpu_smoke_two.py --report /tmp/smoke2.json          # on a machine with 2 GPUs, its own python
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.gpu_smoke import Step, missing, run_step, table, write_report  # noqa: E402

BUDGET_S = 360.0  # 6 minutes
SCRIPT = "bench/gpu/gpu_smoke_two_steps.py"


def _step(name: str, what: str, cap_s: float, least_s: float = 60.0) -> Step:
    return Step(name, what, ("cuda", "vllm", "numpy", "transformers"), cap_s, (SCRIPT, "--step", name),
                least_s=least_s)


STEPS = (
    Step("imports", "torch, CUDA, the devices, NCCL and vLLM", (), 60, ("bench/gpu/gpu_smoke_imports.py",), least_s=1),
    _step("push", "learner rank 0 on GPU 0, an engine on GPU 1: NCCL connect, dense and delta push", 150),
    Step("ring_connect", "F6: NCCL's ring connections at the join or in the first push", ("cuda",), 30,
         (SCRIPT, "--step", "ring_connect"), least_s=5),
    _step("kill_rejoin", "the engine killed mid-push: named, then a new engine rejoins and serves", 150),
    _step("stalled_rebuild", "F1: a rebuild whose second rank never joins: the engine not wedged", 120),
    _step("async_aborts", "(e): aborts mid-decode under async scheduling, the engine keeps stepping", 90),
)


def needs_two(step: Step, probe: dict | None) -> str | None:
    """Why `step` cannot run here: what bench/gpu/gpu_smoke.py's `missing` says, or fewer than two GPUs, or a vLLM
    built for CPUs; ring_connect also needs the push step's log."""
    why = missing(step, probe)
    if why is not None or not step.needs:
        return why
    if probe.get("devices", 0) < 2:
        return f"needs 2 CUDA devices: torch sees {probe.get('devices', 0)}"
    if "vllm" in step.needs and not probe.get("vllm_gpu_build"):
        return "needs vLLM's CUDA build: this Python has " + str((probe.get("packages") or {}).get("vllm"))
    return None


def run(selected: set[str], budget_s: float, work: Path, log=print) -> dict:
    t0, probe, steps, done = time.monotonic(), None, [], set()
    for step in STEPS:
        left = budget_s - (time.monotonic() - t0)
        why = needs_two(step, probe)
        if why is None and step.name not in selected:
            why = "not selected (--steps)"
        if why is None and step.name == "ring_connect" and "push" not in done:
            why = "the push step did not pass: no NCCL log to read"
        if why is None and left < step.least_s:
            why = f"no time left: {left:.0f} s of the {budget_s:.0f} s budget, {step.least_s:.0f} s needed"
        if why is not None:
            rec = {"status": "skipped", "reason": why, "seconds": 0.0, "figures": {}, "tail": ""}
        else:
            log(f"[smoke2] {step.name}: {step.what} (timeout {min(step.cap_s, left):.0f} s)")
            argv = [*step.argv, "--work", str(work)] if step.argv[0] == SCRIPT else list(step.argv)
            rec = run_step([sys.executable, *argv], min(step.cap_s, left))
            if step.name == "imports" and rec["status"] == "passed":
                probe = rec["figures"]
            if rec["status"] == "passed":
                done.add(step.name)
        steps.append({"name": step.name, "what": step.what, "needs": list(step.needs),
                      "command": " ".join(["python", *step.argv]), **rec})
        log(f"[smoke2] {step.name}: {rec['status']} — {rec['reason']}")
    return {"python": sys.executable, "budget_s": budget_s, "total_s": round(time.monotonic() - t0, 1),
            "machine": probe, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", required=True, type=Path, help="the JSON report; the table goes beside it (.md)")
    ap.add_argument("--steps", nargs="+", choices=[s.name for s in STEPS], default=[s.name for s in STEPS])
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all steps together")
    ap.add_argument("--work", type=Path, default=None, help="the steps' shared folder (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.report.suffix == ".md":
        ap.error(f"--report {args.report}: name the JSON report (e.g. smoke2.json); the table goes beside it as .md")
    work = args.work or Path(tempfile.mkdtemp(prefix="smoke2-"))
    report = run(set(args.steps) | {"imports"}, args.budget, work,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    return write_report(report, table(report).replace("GPU smoke (", "GPU smoke, two GPUs (", 1), args.report)


if __name__ == "__main__":
    sys.exit(main())
