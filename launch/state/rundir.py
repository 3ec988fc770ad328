"""Run folders: a new run never writes into another run's folder, and `--resume DIR` continues DIR's
own run with only the changes a resume can make safely.

New run: a new or empty `--output` folder. `--force` starts over in a folder that holds a run (config.yaml,
metrics.jsonl, summary.json or checkpoints/): its contents are deleted once the new configuration has
validated (`clear_run_dir`). A folder that is not empty and holds no run is refused even with --force:
nothing that is not a run is ever deleted.

The same command again (`plan_rerun`): without `--force`, a command whose `--output` folder holds a run
continues that run, as `--resume` would (a Slurm requeue re-runs the job's command line, as veRL's
`resume_mode: auto` expects). The command's configuration, resolved as a new run's would be, must be the
run's in every key a resume cannot change (below): a difference is refused by name. Keys a resume may
change apply as the command gives them (e.g. a larger --steps trains longer); a key the command leaves to
be decided where the run has it decided ("auto" values, null resource defaults) keeps the run's value. A
finished run says it is finished; a run without a checkpoint is refused (there is nothing to continue).

Resume (`plan_resume`): the configuration is DIR's config.yaml, not the algorithm's YAML. Flags and
`--set`s given with `--resume` are laid over it; a key whose value does not change is no change. Keys
in `RESUME_SAFE` (how long and how often: steps, evaluation, checkpoints, logging; how fast and where:
resources, engine settings, micro-batching, the staleness bound, the weight push) apply from the
resumed step on and are recorded in config.yaml (`resumed:`, with the step); any other key would train
a different run from the checkpoint (algorithm, model, data, sampling, batch geometry, optimiser) and
is refused by name. `ray_address` is this invocation's (the cluster where the run goes on).

Steps and the LR schedule: `--resume DIR` alone runs to the saved `learner.steps`; a run already there
is finished and says so (`finished_message`), without starting anything. Training longer takes an
explicit `--steps N`, and nothing more: the LR schedule is a function of (optimiser step, horizon), and
a resume that changes `learner.steps` (without setting `learner.lr_horizon_steps` itself) sets the
horizon to the later of the run's horizon (null = its steps) and N. So a shorter run keeps the curve
it started with, and a cosine or linear schedule extended past its horizon is stretched to end at
step N (it would train at lr 0 otherwise): the LR moves at once to the stretched curve, which the
resume prints (`launch.commands.train.resume_lines`). `--set learner.lr_horizon_steps=H` chooses another
horizon (at least N for a decaying schedule, `RunConfig.problems`).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from learner.committed import committed_steps

RUN_MARKERS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints")

# Keys a resume may change: exact dotted keys, or a section prefix ending in ".".
RESUME_SAFE = (
    "learner.steps", "learner.lr_horizon_steps", "learner.eval_every", "learner.save_every",
    "learner.keep_checkpoints", "learner.hf_every", "learner.collective_timeout_s", "learner.micro_batch_samples", "learner.micro_batch_tokens",
    "learner.packing", "learner.logprob_chunk_tokens", "learner.activation_checkpointing",
    "learner.cpus_per_rank", "learner.gpus_per_rank", "learner.custom_resources",
    "rollout.num_actors", "rollout.prompts_in_flight", "rollout.cpus_per_actor", "rollout.gpus_per_actor",
    "rollout.custom_resources", "rollout.kv_cache_gib", "rollout.engine.", "rollout.deadlines.",
    "buffer.max_staleness", "buffer.max_staleness_auto", "buffer.max_staleness_cap", "buffer.capacity_groups",
    "buffer.max_message_mb", "buffer.host", "buffer.port",
    "weight_sync.", "logging.", "serial", "placement_timeout_s", "max_restarts",
)
NOT_COMPARED = ("resume", "resumed", "ray_address", "logging.output_dir")  # set by the resume itself


def resume_safe(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUME_SAFE)


def is_run_dir(path: Path) -> bool:
    return any((path / m).exists() for m in RUN_MARKERS)


def check_new_run_dir(run_dir: Path, force: bool) -> None:
    """Refuse to start a new run in a folder that holds something (module docstring)."""
    from configs.loading import ConfigError

    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise ConfigError(f"--output {run_dir}: is a file, not a folder — choose another --output")
    if not any(run_dir.iterdir()):
        return
    if not is_run_dir(run_dir):
        raise ConfigError(f"--output {run_dir}: the folder is not empty and holds no run — choose a new or empty "
                          "folder (--force deletes only run folders)")
    if not force:
        step = checkpoint_step(run_dir)
        where = f"checkpoint at step {step}" if step is not None else "no checkpoint"
        raise ConfigError(f"--output {run_dir}: already holds a run ({where}) — continue it with --resume {run_dir}, "
                          f"start it over with --force (deletes its contents), or choose another --output")


def clear_run_dir(run_dir: Path) -> None:
    """Delete the contents of a run folder (`--force`); only called after `check_new_run_dir` passed."""
    if run_dir.is_dir() and is_run_dir(run_dir):
        for child in run_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def checkpoint_step(run_dir: Path) -> int | None:
    """Step of the newest complete checkpoint of a run folder (`learner.committed`), or None."""
    found = committed_steps(Path(run_dir) / "checkpoints")
    return found[-1][0] if found else None


def finished_message(run_dir: Path, step: int, steps: int) -> str:
    """What `--resume DIR` says of a run that reached its steps (results from its summary.json)."""
    summary = run_dir / "summary.json"
    results = ""
    try:
        s = json.loads(summary.read_text())
        if s.get("final_eval_accuracy") is not None:
            results = f"; final eval accuracy {s['final_eval_accuracy']:.3f}"
        if s.get("best_eval_accuracy") is not None:
            results += f", best {s['best_eval_accuracy']:.3f} at step {s.get('best_eval_step')}"
    except (OSError, ValueError, TypeError):
        pass
    return (f"[done] {run_dir} is finished: step {step} of {steps}{results}; checkpoint "
            f"{run_dir / 'checkpoints' / f'step_{step}'}\nTo train longer: algo-train --resume {run_dir} "
            f"--steps N (N > {step})")


def quick_finished(run_dir: str, steps_flag: int | None) -> str | None:
    """The finished message when `--resume run_dir` (with no --steps, or the saved ones) has nothing left
    to do, read from config.yaml and the checkpoints alone; None when there is work or doubt (the full
    resume planning then reports it)."""
    path = Path(run_dir)
    try:
        saved = yaml.safe_load((path / "config.yaml").read_text())
        steps = int(saved["learner"]["steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None
    step = checkpoint_step(path)
    if step is None or step < steps or steps_flag not in (None, steps):
        return None
    return finished_message(path.absolute(), step, steps)


@dataclass
class ResumePlan:
    cfg: Any  # RunConfig to run (the resume recorded in cfg.resumed), or the saved one when finished
    step: int  # learner step of the checkpoint the run continues from
    changes: dict[str, list] = field(default_factory=dict)  # key -> [before, from now on]
    finished: bool = False
    rerun: bool = False  # the command was run again with the run's --output (`plan_rerun`), not --resume


def show_value(v: Any) -> str:
    """A config value as YAML writes it inline (null, true, [0.9, 0.95])."""
    return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def plan_resume(run_dir: str, algo: str | None, config_file: str | None, flags: dict[str, Any],
                overrides: list[str], cwd: Path) -> ResumePlan:
    """The configuration `--resume run_dir` continues with (module docstring). flags: the dedicated CLI
    flags as dotted keys (None = not given); `resume`, `ray_address` and `logging.output_dir` among them
    are the resume's own."""
    from configs.loading import ConfigError, apply_flags, flat, resolve_saved, validate
    from configs.schema import ResumeRecord
    from launch.state.storage import absolutize

    path = Path(run_dir).absolute()
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: not a run folder (no config.yaml)")
    if config_file is not None:
        raise ConfigError(f"--config: a resumed run continues with {path / 'config.yaml'} — drop --config and "
                          "change keys with --set (docs/running.md lists those a resume may change)")
    output = flags.get("logging.output_dir")
    if output is not None and Path(output).absolute() != path:
        raise ConfigError(f"--output {output}: a resumed run writes into its own folder {path} — drop --output")
    saved = resolve_saved(path / "config.yaml")
    if algo is not None and algo != saved.algo:
        raise ConfigError(f"--algo: the run in {path} is {saved.algo}, not {algo} — drop --algo, or start a new "
                          "run with another --output")
    step = checkpoint_step(path)
    if step is None:
        raise ConfigError(f"--resume {run_dir}: no complete checkpoint under {path / 'checkpoints'} (the run stopped "
                          f"before writing one) — start it over: --output {path} --force")
    own = {k: v for k, v in flags.items() if k not in ("resume", "ray_address", "logging.output_dir")}
    data = apply_flags(saved.model_dump(mode="json"), own, overrides)
    learner = data.get("learner", {})
    asked = learner.get("steps") if isinstance(learner, dict) else None
    if type(asked) is int and asked <= step:
        if asked == saved.learner.steps:
            return ResumePlan(saved, step, finished=True)
        raise ConfigError(f"learner.steps: the run in {path} is at step {step} already — pass --steps larger than "
                          f"{step} to train longer")
    if (isinstance(learner, dict) and type(asked) is int and asked != saved.learner.steps
            and learner.get("lr_horizon_steps") == saved.learner.lr_horizon_steps):  # not set by this resume
        horizon = saved.learner.lr_horizon_steps or saved.learner.steps
        decays = saved.learner.lr_schedule != "constant"
        learner["lr_horizon_steps"] = max(horizon, asked) if decays else horizon  # module docstring
    new = absolutize(validate(data), cwd)
    before, after = flat(saved), flat(new)
    changes = {k: [before[k], after[k]] for k in after
               if after[k] != before[k] and k not in NOT_COMPARED}
    refused = [k for k in changes if not resume_safe(k)]
    if refused:
        listed = "; ".join(f"{k} (run: {show_value(changes[k][0])}, asked: {show_value(changes[k][1])})" for k in refused)
        raise ConfigError(f"--resume {run_dir}: a resume cannot change {listed} — it would train a different run "
                          f"from this checkpoint; start a new run with another --output instead. A resume may "
                          f"change: {', '.join(k + ('*' if k.endswith('.') else '') for k in RESUME_SAFE)}")
    new.resume = str(path)
    new.ray_address = flags.get("ray_address")
    new.resumed = [*saved.resumed, ResumeRecord(step=step, changes=changes)]
    return ResumePlan(new, step, changes)


def plan_rerun(output: str, algo: str | None, config_file: str | None, flags: dict[str, Any],
               overrides: list[str], cwd: Path) -> ResumePlan | None:
    """What a training command does with an `--output` folder that may hold its run (module docstring):
    None when the folder holds no run (a new run starts; `check_new_run_dir` judges the folder), else the
    `ResumePlan` that continues the run (`finished` when it is). Raises `ConfigError` for a run without a
    checkpoint, or one whose configuration differs from the command's in a key a resume cannot change
    (each named, with the run's value and the command's)."""
    from configs.loading import ConfigError, flat, read_yaml, resolve, validate
    from launch.state.storage import absolutize

    path = Path(output).absolute()
    if not path.is_dir() or not is_run_dir(path):
        return None
    step = checkpoint_step(path)
    if step is None:
        raise ConfigError(f"--output {output}: holds a run that stopped before its first checkpoint, so there is "
                          "nothing to continue — start it over with --force (deletes its contents), or choose "
                          "another --output")
    saved = validate(read_yaml(path / "config.yaml", what=f"--output {output}"))
    with contextlib.redirect_stderr(io.StringIO()):  # resolve's notices concern a new run; this one goes on
        asked = resolve(algo, config_file, flags, overrides)
        # compared at the run's length: a default fitted to the steps (fit_warmup) is then the run's
        command = absolutize(resolve(algo, config_file, flags, [*overrides, f"learner.steps={saved.learner.steps}"]),
                             cwd)
    before, after = flat(saved), flat(command)
    differ = {k: [before[k], after[k]] for k in after
              if after[k] != before[k] and after[k] != "auto" and k not in NOT_COMPARED}
    refused = [k for k in differ if not resume_safe(k)]
    if refused:
        listed = "; ".join(f"{k} (run: {show_value(differ[k][0])}, this command: {show_value(differ[k][1])})"
                           for k in refused)
        raise ConfigError(f"--output {output}: holds a run of another configuration: {listed} — continue that run "
                          f"as it is with --resume {output}, start it over with --force (deletes its contents), "
                          "or choose another --output")
    own = {k: now for k, (_, now) in differ.items() if now is not None}
    plan = plan_resume(str(path), None, None, own | {"learner.steps": asked.learner.steps,
                                                      "ray_address": flags.get("ray_address")}, [], cwd)
    plan.rerun = True
    return plan
