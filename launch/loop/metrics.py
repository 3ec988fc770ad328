"""Metrics: the driver's part of a step's row (`step_row`), the one-writer-per-key merge of a row's
parts (`merge_rows`), and the run's outputs, `metrics.jsonl` (one JSON object per learner step),
TensorBoard events and `eval_prompts.jsonl` (each held-out prompt's reward at every evaluation).

A row is merged from parts each written by one component: the learner's step metrics (`Learner.step`),
the driver's (`step_row`) and, on evaluation steps, the evaluation's. Each key has exactly one writer:
`merge_rows` refuses a key that two parts write, so a component can never silently overwrite what
another one measured.

Values are converted to plain floats; non-finite values are written as null in JSON (and skipped in
TensorBoard) so a reader never chokes on NaN. Keys are defined in docs/metrics.md.

A resumed run continues from its checkpoint's step: rows of later steps (written after that
checkpoint by the interrupted run, trained again now) are removed from metrics.jsonl and purged from
TensorBoard (`from_step`), so every step appears once. The writer also keeps the held-out accuracies
seen in the run (`evals`), for the end-of-run summary.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.multiturn import env_metrics
from tasks.rewards import reward_metrics


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one learner step of the driver's loop (docs/metrics.md, `time/*`)."""
    wait_s: float  # waiting for the buffer to hold a full batch
    train_s: float  # the learner step as the driver waited for it (shipping the batch to the ranks included)
    sync_s: float  # weight sync: the rest of the previous push, then gathering this version's weights
    since_last_s: float  # since the previous row was read (the interval of `throughput/*`)
    wall_s: float  # since the training loop started


class LoopClock:
    """The training loop's clock: `lap` reads the time once per row."""

    def __init__(self):
        self.start = self.last = time.monotonic()

    def lap(self, *, wait_s: float, train_s: float, sync_s: float) -> StepTimes:
        now = time.monotonic()
        times = StepTimes(wait_s, train_s, sync_s, since_last_s=now - self.last, wall_s=now - self.start)
        self.last = now
        return times


def step_row(groups: list, times: StepTimes, sync: dict, buffer: dict, *, version: int, actor_restarts: int,
             buffer_restarts: int, actor_reports: Iterable[dict]) -> dict[str, Any]:
    """The driver's keys of a step's row: the version after the step, train accuracy, response lengths
    (`response_metrics`) and throughput of the batch `groups`, the loop's times, the push settled since
    the last row (`sync`: weight-sync stats, {} when none), the buffer's counters (`buffer`: its stats),
    restarts, and the actors' reward errors and version counters (`actor_reports`: their last stats)."""
    actor_reports = list(actor_reports)
    samples = sum(g.n for g in groups)
    generated = [s.reward for g in groups for s in g.samples if s.finish_reason != "demo"]
    tokens = sum(int(s.tokens.size) for g in groups for s in g.samples)
    return {
        "version": version,
        "accuracy/train": sum(r >= 1.0 for r in generated) / len(generated) if generated else None,
        "accuracy/train_groups_solved": groups_solved(groups),
        "throughput/samples_per_s": samples / times.since_last_s,
        "throughput/tokens_per_s": tokens / times.since_last_s,
        "time/generate_wait_s": times.wait_s, "time/train_s": times.train_s, "time/weight_sync_s": times.sync_s,
        "time/wall_s": times.wall_s,
        "weight_sync/gbps": sync.get("gbps"), "weight_sync/refused": sync.get("refused", 0),
        "weight_sync/push_s": sync.get("seconds"), "weight_sync/bytes": sync.get("bytes"),
        "weight_sync/changed_frac": sync.get("changed_frac"),
        "buffer/dropped_stale": buffer.get("dropped_stale", 0),
        "buffer/auth_refused": buffer.get("auth", {}).get("refused_peers", 0),
        "buffer/auth_refused_attempts": buffer.get("auth", {}).get("refused", 0),
        "buffer/occupancy_groups": buffer.get("occupancy_groups", 0),
        "buffer/filtered": sum(buffer.get("filtered", {}).values()),
        "buffer/generated_samples": buffer.get("generated_samples", 0),
        "buffer/generated_correct": buffer.get("generated_correct", 0),
        "actors/restarts": actor_restarts, "buffer/restarts": buffer_restarts,
        **response_metrics(groups), **reward_metrics(actor_reports), **weight_metrics(actor_reports),
        **engine_metrics(actor_reports), **repair_metrics(actor_reports), **tool_rows(groups, env_metrics(actor_reports)),
    }


def groups_solved(groups: list) -> float | None:
    """Share of the batch's groups holding at least one generated row with reward 1 (a demonstration row does
    not count; a group of demonstrations only is left out); None when no group has a generated row. Where
    rewards are sparse it says how many prompts the policy reaches on its own (LUFFY's paper plots it)."""
    solved = [any(s.reward >= 1.0 for s in own) for g in groups
              if (own := [s for s in g.samples if s.finish_reason != "demo"])]
    return sum(solved) / len(solved) if solved else None


def tool_rows(groups: list, env: dict) -> dict:
    """`env` (the env/* counts, {} for single-turn runs) with `env/tool_share`: the share of the batch's generated
    rows holding environment tokens (`Sample.env_mask`; with tools: a call made, or a malformed one answered)."""
    generated = [s for g in groups for s in g.samples if s.finish_reason != "demo"]
    if not env or not generated:
        return env
    return {**env, "env/tool_share": sum(bool(s.env_mask.any()) for s in generated) / len(generated)}


def response_metrics(groups: list) -> dict:
    """Length of the batch's generated responses (demonstration rows excluded, as for `accuracy/train`;
    a guided row's demonstration prefix counts): mean and max in tokens, and the share that stopped at
    the token limit before an eos (`Sample.truncated`, vLLM's finish reason "length"). None without
    generated samples."""
    generated = [s for g in groups for s in g.samples if s.finish_reason != "demo"]
    if not generated:
        return {"response/length_mean": None, "response/length_max": None, "response/clipped_frac": None}
    lengths = [int(s.tokens.size) for s in generated]
    return {"response/length_mean": sum(lengths) / len(lengths), "response/length_max": max(lengths),
            "response/clipped_frac": sum(bool(s.truncated) for s in generated) / len(generated)}


def weight_metrics(reports) -> dict:
    """Run metrics from the actors' last stats (`AsyncActor.stats`; docs/metrics.md): groups dropped because
    their tokens were sampled under no version (after a failed or aborted push), and the share of the
    generated tokens acknowledged by the buffer that sit in rows spanning more than one version."""
    reports = list(reports)
    tokens = sum(r.get("sent_tokens", 0) for r in reports)
    mixed = sum(r.get("mixed_version_tokens", 0) for r in reports)
    return {"actors/groups_no_version": sum(r.get("groups_no_version", 0) for r in reports),
            "actors/mixed_version_share": mixed / tokens if tokens else None}


def repair_metrics(reports) -> dict:
    """The rollout deadlines' counts from the actors' last stats (`actors.deadlines`; docs/metrics.md), summed:
    samples aborted, samples regenerated, groups dropped with their prompts re-queued."""
    reports = list(reports)
    return {f"actors/{key}": sum(r.get(key, 0) for r in reports)
            for key in ("requests_aborted", "members_regenerated", "groups_requeued")}


def engine_metrics(reports) -> dict:
    """How busy the engines are, from the actors' last stats (`AsyncActor.stats`, `actors.occupancy`): the
    sequences in flight per engine (each actor's average over its last ~30 s: prompts in flight × rollout.n),
    the sequences an engine holds at full length (its KV cache, at most its max_num_seqs), means over the
    engines that report them, and in flight over held summed over the engines whose capacity is known."""
    reports = list(reports)
    flying = [r["seqs_in_flight"] for r in reports if r.get("seqs_in_flight") is not None]
    known = [(r["seqs_in_flight"], r["seq_capacity"]) for r in reports
             if r.get("seqs_in_flight") is not None and r.get("seq_capacity")]
    return {"actors/seqs_in_flight": sum(flying) / len(flying) if flying else None,
            "actors/seq_capacity": sum(c for _, c in known) / len(known) if known else None,
            "actors/engine_occupancy": sum(f for f, _ in known) / sum(c for _, c in known) if known else None}


def merge_rows(**parts: dict[str, Any]) -> dict[str, Any]:
    """One row from the parts of its writers (`learner=..., driver=...`, in that order); a key written by
    two of them is an error that names both (each key has one writer: docs/metrics.md)."""
    row: dict[str, Any] = {}
    writer: dict[str, str] = {}
    for name, part in parts.items():
        for key in part:
            if key in writer:
                raise ValueError(f"metric {key!r} is written by both {writer[key]} and {name}: each key has one "
                                 "writer (rename one, docs/metrics.md)")
            writer[key] = name
        row |= part
    return row


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True, from_step: int | None = None,
                 wandb: dict | None = None):
        """from_step: the step a resumed run continues from; rows of later steps are dropped.
        wandb: `wandb.init` arguments (`wandb_init`) to log the same scalars to Weights & Biases; None = off."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "metrics.jsonl"
        kept = [r for r in read_metrics(self.run_dir) if from_step is None or r.get("step", 0) <= from_step] \
            if path.exists() else []
        if from_step is not None and path.exists():
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, path)
        self.evals: dict[int, float] = {r["step"]: r["eval/accuracy"] for r in kept
                                        if r.get("eval/accuracy") is not None}
        self._jsonl = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = from_step + 1 if from_step else None  # hide events of steps trained again
            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge)
        self._wb = None
        if wandb is not None:
            import wandb as wb

            self._wb = wb.init(**wandb)

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": step} | {k: _plain(v) for k, v in metrics.items() if k != "step"}
        self._jsonl.write(json.dumps(row, sort_keys=False) + "\n")
        if row.get("eval/accuracy") is not None:
            self.evals[step] = row["eval/accuracy"]
        scalars = {k: v for k, v in row.items()
                   if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, global_step=step)
        if self._wb is not None and scalars:
            self._wb.log(scalars, step=step)
        return row

    def write_text(self, tag: str, text: str, step: int) -> None:
        """A text entry in TensorBoard (markdown), e.g. samples; nothing without TensorBoard."""
        if self._tb is not None:
            self._tb.add_text(tag, text, global_step=step)

    def eval_summary(self) -> dict[str, Any]:
        """{final_eval_accuracy, final_eval_step, best_eval_accuracy, best_eval_step} over the run's
        evaluations (None when there was none); the best is the earliest step of the highest accuracy."""
        if not self.evals:
            return {"final_eval_accuracy": None, "final_eval_step": None, "best_eval_accuracy": None,
                    "best_eval_step": None}
        last = max(self.evals)
        best = min(self.evals, key=lambda s: (-self.evals[s], s))
        return {"final_eval_accuracy": self.evals[last], "final_eval_step": last,
                "best_eval_accuracy": self.evals[best], "best_eval_step": best}

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wb is not None:
            self._wb.finish()


def wandb_init(cfg, run_dir: Path) -> dict | None:
    """`wandb.init` arguments for the run (None unless logging.wandb): the run folder's name, files under
    run_dir/wandb, the resolved config, and an id kept in run_dir/wandb_id so a resumed run continues
    the same W&B run (W&B ignores steps it has already seen: rows a resume trains again are not re-logged)."""
    lc = cfg.logging
    if not lc.wandb:
        return None
    id_file = run_dir / "wandb_id"
    if not id_file.exists():
        import uuid

        id_file.write_text(uuid.uuid4().hex[:16])
    return {"project": lc.wandb_project, "entity": lc.wandb_entity, "name": run_dir.name, "dir": str(run_dir),
            "id": id_file.read_text().strip(), "resume": "allow", "config": cfg.model_dump(mode="json")}


def save_eval_prompts(run_dir: Path, step: int, per_prompt: list) -> None:
    """Append one evaluation's per-prompt rewards to run_dir/eval_prompts.jsonl: {"step", "prompt_index": [...],
    "reward": [...]} (indices ascending), so two runs' final models can be compared prompt by prompt
    (bench.common.stats.mcnemar_exact). A resume appends again for the steps it trains again: the last line of
    a step is the one of the run's model (`read_eval_prompts`)."""
    line = {"step": step, "prompt_index": [int(i) for i, _ in per_prompt],
            "reward": [float(r) for _, r in per_prompt]}
    with open(Path(run_dir) / "eval_prompts.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def read_eval_prompts(run_dir: str | Path) -> dict[int, dict[int, float]]:
    """{step: {prompt_index: reward}} of a run's eval_prompts.jsonl, the last line of each step winning."""
    out: dict[int, dict[int, float]] = {}
    for line in (Path(run_dir) / "eval_prompts.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a truncated last line from a crash
            continue
        out[row["step"]] = dict(zip(row["prompt_index"], row["reward"]))
    return out


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's metrics.jsonl (a truncated last line from a crash is ignored)."""
    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (is {run_dir} a run folder?)")
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def run_summary(*, algo: str, step: int, steps: int, stopped_early: bool, elapsed_s: float, training_s: float,
                checkpoint: str, model: str | None, evals: dict[str, Any], internals: dict[str, Any]) -> dict[str, Any]:
    """summary.json: the results a user reads first (steps reached, held-out accuracy at the end and at
    its best, times, the resume checkpoint and the exported HF model), then the run's internals (version,
    driver pid, buffer statistics). elapsed_s: this process's wall time, start-up included; training_s:
    since its first step."""
    return {"algo": algo, "step": step, "steps": steps, "stopped_early": stopped_early, **evals,
            "elapsed_s": round(elapsed_s, 1), "training_s": round(training_s, 1), "checkpoint": checkpoint,
            "model": model, **internals}


def done_line(summary: dict[str, Any]) -> str:
    """The console's last line of a run, from its summary."""
    from launch.loop.progress import fmt_duration

    s = summary
    head = f"stopped at step {s['step']} of {s['steps']}" if s["stopped_early"] else f"{s['step']} steps"
    acc = ""
    if s.get("final_eval_accuracy") is not None:
        acc = f"; held-out accuracy {s['final_eval_accuracy']:.3f} (step {s['final_eval_step']})"
        if s["best_eval_step"] != s["final_eval_step"]:
            acc += f", best {s['best_eval_accuracy']:.3f} at step {s['best_eval_step']}"
    where = f"model {s['model']}" if s.get("model") else f"checkpoint {s['checkpoint']}"
    return f"[done] {head} in {fmt_duration(s['elapsed_s'])} (training {fmt_duration(s['training_s'])}){acc}; {where}"
