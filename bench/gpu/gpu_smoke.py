"""GPU smoke check for the first machine with a GPU: the one-GPU plan of reviews/gpu_path_2.md §3, each step
under its own timeout, all within `--budget` seconds (7 minutes), one report.

Why a script: a GPU is lent for minutes at a time, to a machine that reaches no network and may lack vLLM
(the repository's virtualenv is CPU-only, so the machine's own Python runs this). Every step that can run
there runs; every other one is skipped with the reason, and the report says which is which.

Steps, in order (a step needing something the import probe did not find is skipped, saying what):
  imports             torch, its CUDA and the device, NCCL, the packages below (bench/gpu/gpu_smoke_imports.py)
  staging_tests       pytest tests/weightsync/test_staging.py: staging and the send stream with fake CUDA ops,
                      and on CUDA the real pinned, registered, reused host memory (C1, C2, N2, N3)
  overlap_c1          a delta push whose broadcasts block their stream leaves the training stream alone
                      (bench/gpu/gpu_smoke_c1.py, Appendix A)
  staging_7b          a Qwen2.5-7B-shaped push staged to host memory: time of the first and later pushes,
                      registered host bytes, nothing left on the GPU (bench/gpu/gpu_smoke_staging.py, Appendix B)
  learner_gpu_tests   pytest tests/learner/test_gpu.py: a bf16 FSDP2 step, packed log-probs, the weight stream
  memory_7b           the learner's activation bytes per token at Qwen2.5-7B width and vocabulary against
                      launch/planning/memory_estimate.py (bench/gpu/gpu_smoke_memory.py)
  vllm_engine_import  weightsync.nccl.engine imports against the installed vLLM (every name it needs exists)
  nccl_unique_id      pytest test_nccl_plane.py -k real_unique_id: libnccl mints an id vLLM's init info takes
  learner_bench       optional, when time is left: python bench/gpu/gpu_learner.py --shapes 1.5b --steps 3 --warmup 1
What one GPU cannot show (the review): a real NCCL push (learner and engine on one device are refused by
NCCL), multi-rank FSDP, the multi-node bootstrap, engines sharing a GPU.

Report: `--report PATH` gets the JSON (every step: status passed / failed / timeout / skipped, the reason,
seconds, figures, the end of its output), and PATH with the suffix .md a table of the same; the table is
also printed. Exit status 1 when a step failed or timed out, else 0 (skips are not failures).

    python bench/gpu/gpu_smoke.py --report /tmp/smoke.json              # on the GPU machine, its own python
    python bench/gpu/gpu_smoke.py --report /tmp/smoke.json --steps imports staging_tests
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 420.0  # 7 minutes: the device machine's command limit less its start and the transfers
TAIL_CHARS = 3000  # of each step's output kept in the report
LEARNER_PACKAGES = ("pytest", "transformers", "pydantic", "yaml", "safetensors", "tokenizers", "numpy")

# Qwen2.5-7B's config.json (shapes only: what the staging and memory probes build), and a tiny stand-in
# for running the probes' code on a CPU
MODEL_CONFIGS = {
    "7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
               rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "tiny": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=512,
                 rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
}


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    needs: tuple[str, ...]  # "torch", "cuda", "vllm" or a module the import probe looks up
    cap_s: float  # this step's timeout (less when the budget has less left)
    argv: tuple[str, ...]  # run with this Python, in the repository root
    least_s: float = 15.0  # not started with less of the budget left


def _pytest(*args: str) -> tuple[str, ...]:
    return ("-m", "pytest", "-q", "-p", "no:cacheprovider", *args)


STEPS = (
    Step("imports", "torch, CUDA, NCCL and the packages the steps need", (), 60, ("bench/gpu/gpu_smoke_imports.py",),
         least_s=1),
    Step("staging_tests", "staging and the send stream, fake CUDA ops; real pinned memory on CUDA (C1, C2, N2, N3)",
         ("torch", "numpy", "pytest"), 120, _pytest("tests/weightsync/test_staging.py")),
    Step("overlap_c1", "a blocked delta push leaves the training stream alone (Appendix A)", ("cuda", "numpy"), 90,
         ("bench/gpu/gpu_smoke_c1.py",)),
    Step("staging_7b", "7B-shaped pushes staged to host memory: time, host bytes, GPU left (Appendix B)",
         ("cuda", "numpy"), 180, ("bench/gpu/gpu_smoke_staging.py",)),
    Step("learner_gpu_tests", "bf16 FSDP2 step, packed log-probs, weight stream on CUDA",
         ("cuda", *LEARNER_PACKAGES), 180, _pytest("tests/learner/test_gpu.py")),
    Step("memory_7b", "activation bytes per token at 7B width against the estimate (N8, C7)",
         ("cuda", "transformers", "numpy"), 120, ("bench/gpu/gpu_smoke_memory.py",)),
    Step("vllm_engine_import", "weightsync.nccl.engine imports against the installed vLLM (A3)", ("vllm", "numpy"),
         90, ("-c", "import json, vllm, weightsync.nccl.engine; print('SMOKE ' + json.dumps({'summary': "
                    "'weightsync.nccl.engine imports against vLLM ' + vllm.__version__}))")),
    Step("nccl_unique_id", "libnccl mints a unique id vLLM's NCCL init info decodes",
         ("cuda", "vllm", "pytest", "numpy"),
         60, _pytest("tests/weightsync/test_nccl_plane.py", "-k", "real_unique_id")),
    Step("learner_bench", "learner vs a plain loop, 1.5B-shaped, packed/padded, checkpointing (optional)",
         ("cuda", *LEARNER_PACKAGES), 240, ("bench/gpu/gpu_learner.py", "--shapes", "1.5b", "--steps", "3", "--warmup", "1"),
         least_s=150),
)
STATUSES = ("passed", "failed", "timeout", "skipped")


def run_step(argv: list[str], timeout_s: float, cwd: Path = ROOT) -> dict:
    """Run `argv` in its own process group, killed with the group at `timeout_s`. Returns {status, reason,
    seconds, figures, tail}: figures from the last output line `SMOKE {json}`, or pytest's counts."""
    env = {"HF_HUB_OFFLINE": "1",  # nothing here downloads: on a machine without network, never wait for one
           **os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - t0
    lines = [ln for ln in (out or "").splitlines() if ln.strip()]
    figures = next((json.loads(ln[6:]) for ln in reversed(lines) if ln.startswith("SMOKE ")), {})
    counts = pytest_counts(lines)
    if counts:
        figures = {**figures, "pytest": counts}
    if timed_out:
        status, reason = "timeout", f"killed after its timeout of {timeout_s:.0f} s"
    elif proc.returncode == 0:
        status = "passed"
        reason = figures.get("summary") or (", ".join(f"{n} {k}" for k, n in counts.items()) if counts else "ok")
        skips = sorted({m.group(1) for ln in lines if (m := re.match(r"SKIPPED \[\d+\] \S+?:\d+: (.*)", ln))})
        reason += f" (skipped: {'; '.join(skips)})" if skips else ""
    else:
        status, reason = "failed", f"exit status {proc.returncode}: {lines[-1] if lines else 'no output'}"
    return {"status": status, "reason": reason, "seconds": round(seconds, 1), "figures": figures,
            "tail": (out or "")[-TAIL_CHARS:]}


def pytest_counts(lines: list[str]) -> dict[str, int]:
    """{"passed": 3, "skipped": 2, ...} from pytest's last summary line ({} when there is none)."""
    for ln in reversed(lines):
        found = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", ln)
        if found and re.search(r" in [\d.]+s", ln):
            return {k: int(n) for n, k in found}
    return {}


def missing(step: Step, probe: dict | None) -> str | None:
    """Why `step` cannot run here (None: it can), from the import probe's figures."""
    if not step.needs:
        return None
    if probe is None:
        return "the import probe did not finish, so what this step needs is unknown"
    for need in step.needs:
        if need == "torch":
            continue  # the probe imported it
        if need == "cuda" and not probe.get("cuda"):
            return f"needs CUDA: torch {probe.get('torch')} sees no GPU (torch.cuda.is_available() is False)"
        if need not in ("cuda", "torch") and not probe.get("packages", {}).get(need):
            return f"needs {need}: not installed for {probe.get('executable', 'this Python')}"
    return None


def run(selected: set[str], budget_s: float, log=print) -> dict:
    """Every step of `STEPS` in order: run (those in `selected` that can run here and fit the budget) or
    skipped with the reason. Returns the report."""
    t0, probe, steps = time.monotonic(), None, []
    for step in STEPS:
        left = budget_s - (time.monotonic() - t0)
        why = missing(step, probe)
        if why is None and step.name not in selected:
            why = "not selected (--steps)"
        if why is None and left < step.least_s:
            why = f"no time left: {left:.0f} s of the {budget_s:.0f} s budget, {step.least_s:.0f} s needed"
        if why is not None:
            rec = {"status": "skipped", "reason": why, "seconds": 0.0, "figures": {}, "tail": ""}
        else:
            log(f"[smoke] {step.name}: {step.what} (timeout {min(step.cap_s, left):.0f} s)")
            rec = run_step([sys.executable, *step.argv], min(step.cap_s, left))
            if step.name == "imports" and rec["status"] == "passed":
                probe = rec["figures"]
        steps.append({"name": step.name, "what": step.what, "needs": list(step.needs),
                      "command": " ".join(["python", *step.argv]), **rec})
        log(f"[smoke] {step.name}: {rec['status']} — {rec['reason']}")
    return {"python": sys.executable, "budget_s": budget_s, "total_s": round(time.monotonic() - t0, 1),
            "machine": probe, "steps": steps}


def table(report: dict) -> str:
    """The report as a markdown table, one row per step."""
    rows = ["| # | step | status | s | reason / result |", "|---|---|---|---|---|"]
    for i, s in enumerate(report["steps"]):
        reason = s["reason"].replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {i} | {s['name']} | {s['status']} | {s['seconds']:.1f} | {reason} |")
    head = (f"GPU smoke ({report['python']}, {report['total_s']:.0f} s of a {report['budget_s']:.0f} s budget): "
            + (report["machine"] or {}).get("summary", "import probe did not finish"))
    return head + "\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", required=True, type=Path, help="the JSON report; the table goes beside it (.md)")
    ap.add_argument("--steps", nargs="+", choices=[s.name for s in STEPS], default=[s.name for s in STEPS],
                    help="steps to run (the import probe always runs: the others depend on it)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all steps together")
    args = ap.parse_args(argv)
    if args.report.suffix == ".md":
        ap.error(f"--report {args.report}: name the JSON report (e.g. smoke.json); the table goes beside it as .md")
    report = run(set(args.steps) | {"imports"}, args.budget, log=lambda m: print(m, file=sys.stderr, flush=True))
    return write_report(report, table(report), args.report)


def write_report(report: dict, text: str, path: Path) -> int:
    """The JSON report at `path` and its table beside it (.md), the table printed; the exit status: 1 when a
    step failed or timed out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(text)
    print(text, flush=True)
    return 1 if any(s["status"] in ("failed", "timeout") for s in report["steps"]) else 0


if __name__ == "__main__":
    sys.exit(main())
