"""Entry point of a training run: run folder, resolved config, resource check, a quiet console, then the
process graph (in a supervised child, `launch.commands.supervisor`), and what to do next when it stops."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from configs.loading import ConfigError, dump_annotated
from configs.schema import RunConfig
from launch.commands.console import quiet_env
from launch.commands.push import push_export, push_problem
from launch.loop.progress import Progress
from launch.planning.cluster import ClusterInfo
from launch.planning.resources import ResourceError, plan, start_lines
from launch.prep.preflight import PreflightError, preflight
from launch.state.rundir import ResumePlan, check_new_run_dir, checkpoint_step, clear_run_dir, show_value
from launch.state.storage import absolutize


def run_dir_for(cfg: RunConfig) -> Path:
    if cfg.resume:
        return Path(cfg.resume)
    if cfg.logging.output_dir:
        return Path(cfg.logging.output_dir)
    return Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_writable(run_dir: Path, resuming: bool) -> None:
    """Raise `ConfigError` (one line: the folder, why, the fix) unless this process can create `run_dir`
    and write a file in it: a read-only filesystem, a folder of another user, a file in place of a folder.
    Leaves the filesystem as it found it: the folders it created and its probe file are removed again
    (the run creates its folder once every check has passed)."""
    missing = []  # run_dir and the parents it lacks, deepest first
    at = run_dir
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    probe = run_dir / f".write-check-{os.getpid()}"
    try:
        for folder in reversed(missing):
            folder.mkdir()
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        why = e.strerror or str(e)
        if e.filename and Path(e.filename) not in (run_dir, probe):  # a parent folder is the problem
            why += f": {e.filename}"
        fix = ("a resumed run writes into its folder: make it writable, or copy the run to a writable place and "
               "resume the copy") if resuming else "choose a folder you can write to with --output DIR"
        raise ConfigError(f"{'--resume' if resuming else '--output'} {run_dir}: cannot write there ({why}) — "
                          f"{fix}") from None
    finally:
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()


def write_config(run_dir: Path, cfg: RunConfig) -> None:
    """config.yaml, replaced atomically (a resume rewrites it with its `resumed:` record)."""
    tmp = run_dir / ".config.yaml.tmp"
    tmp.write_text(dump_annotated(cfg) + "\n")
    os.replace(tmp, run_dir / "config.yaml")


def resume_lines(resume: ResumePlan, run_dir: Path) -> list[str]:
    """What a resume says before it starts: the step, each change, and the LR the stretched schedule
    moves to when learner.lr_horizon_steps was raised on a decaying schedule (by --steps past the
    horizon, `launch.state.rundir.plan_resume`, or by hand)."""
    show = ", ".join(f"{k} {show_value(a)} -> {show_value(b)}" for k, (a, b) in resume.changes.items())
    why = "holds this command's run (--force starts it over): continuing it " if resume.rerun else ""
    lines = [f"[resume] {run_dir} {why}from step {resume.step} to step {resume.cfg.learner.steps}: "
             f"{show or 'no changes'}"]
    lc = resume.cfg.learner
    old_h, new_h = resume.changes.get("learner.lr_horizon_steps", [None, None])
    old_h = old_h or resume.changes.get("learner.steps", [lc.steps])[0]  # null = the run's steps then
    if new_h is not None and new_h != old_h and lc.lr_schedule != "constant":
        from learner.optim import lr_at

        updates = lc.mini_batches * lc.epochs
        at = resume.step * updates

        def lr(h: int) -> float:
            return lr_at(at, peak=lc.lr, warmup=lc.warmup_steps, total=h * updates, schedule=lc.lr_schedule)

        lines.append(f"[resume] the {lc.lr_schedule} LR schedule now ends at step {new_h} instead of {old_h} (its "
                     f"decay stretched to the new end): lr at the next optimiser step {lr(old_h):.3g} -> "
                     f"{lr(new_h):.3g}")
    return lines


def train(cfg: RunConfig, force: bool = False, resume: ResumePlan | None = None, push_to: str | None = None,
          public: bool = False, presets: str | None = None) -> int:
    """Start the run `cfg` (a new one, or `resume`'s continuation); returns the exit status. push_to: the Hub
    repository its final HF export goes to once it has finished (`launch.commands.push`; public: created
    public instead of private). presets: the line saying which preset values a user's model got
    (`configs.presets.describe`), said once the checks have passed."""
    try:
        if push_to is not None and (problem := push_problem(push_to)):
            raise ConfigError(problem)
        run_dir = run_dir_for(cfg).absolute()
        if resume is None:
            check_new_run_dir(run_dir, force)
        check_writable(run_dir, resuming=resume is not None)
        preflight(cfg)  # every file and plugin the run names, before Ray or a run folder exists
        cluster = ClusterInfo.discover(cfg.ray_address, serial=cfg.serial)
        cfg = cluster.resolve(cfg)  # "auto" decided, ray_address = the cluster joined: what config.yaml records
        cfg = absolutize(cfg, Path.cwd())  # every node must find the same files (launch.state.storage)
        planned = plan(cfg, cluster.nodes, joined=cluster.cluster, driver=cluster.driver)
    except (ConfigError, ResourceError, PreflightError) as e:
        print(f"algo-train: {e}", file=sys.stderr)
        return 2
    if force:
        clear_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    os.environ.update(quiet_env(cfg, starts_local_ray=not cfg.serial and not cluster.cluster, environ=os.environ))
    progress = Progress(cfg.learner.steps, cfg.logging.progress)
    progress.message(f"[run] {cluster.describe()}")
    progress.message(f"[run] {cfg.algo}: {cfg.rollout.num_actors} actor(s), {cfg.learner.world_size} learner "
                     f"rank(s), max_staleness {staleness_text(cfg)}, {cfg.learner.steps} steps -> {run_dir}")
    for line in [*([presets] if presets else []), *start_lines(cfg), *planned.notes]:  # notes: idle GPU engines
        progress.message(line)  # start_lines: GPU runs' weight sync of shared GPUs, the learner memory estimate
    for line in resume_lines(resume, run_dir) if resume is not None else ():
        progress.message(line)
    from launch.commands.supervisor import supervise

    status = supervise(cfg, run_dir)
    status = restart_after_learner_deaths(status, cfg, run_dir, supervise, progress.message)
    after = after_run(status, run_dir)
    if after:
        print(after, file=sys.stderr)
    if status == 0 and push_to is not None:
        status = push_export(run_dir, push_to, private=not public)
    return status


def restart_after_learner_deaths(status: int, cfg: RunConfig, run_dir: Path, supervise, say) -> int:
    """With `max_restarts` N, a run stopped by a dead learner rank (status LEARNER_DIED) resumes itself
    from its last checkpoint, as `--resume run_dir` would, up to N times; returns the final status.
    Each restart is one line: the dead rank as the run's process named it (`take_death_note`), then
    the restart."""
    from launch.commands.supervisor import LEARNER_DIED, take_death_note
    from launch.state.rundir import plan_resume

    for k in range(1, cfg.max_restarts + 1):
        step = checkpoint_step(run_dir)
        if status != LEARNER_DIED or step is None:
            break
        death = take_death_note(run_dir)
        say(f"[learner] {f'{death}; ' if death else ''}restart {k} of {cfg.max_restarts}: resuming {run_dir} "
            f"from step {step}")
        plan = plan_resume(str(run_dir), None, None, {}, [], Path.cwd())
        write_config(run_dir, plan.cfg)
        status = supervise(plan.cfg, run_dir)
    return status


def after_run(status: int, run_dir: Path) -> str | None:
    """What to do next when a run stopped before its end: the exact resume command (Ctrl-C: 130; an
    error: any status but 0 and 2), or how to start over when it left no checkpoint. A dead learner
    rank is said in the same line, first (`take_death_note`)."""
    from launch.commands.supervisor import LEARNER_DIED, take_death_note

    if status in (0, 2):
        return None
    step = checkpoint_step(run_dir)
    death = take_death_note(run_dir) if status in (LEARNER_DIED, 130) else None  # 130: died while stopping
    why = "stopped" if status == 130 else f"failed (exit status {status})"
    head = f"[learner] {death}; the run stopped" if death else f"[stop] the run {why}"
    if step is None:
        return f"{head} before its first checkpoint; start it over: --output {run_dir} --force"
    fix = "" if status == 130 or death else " once the cause is fixed"
    return f"{head}; continue from step {step}{fix}: algo-train --resume {run_dir}"


def staleness_text(cfg: RunConfig) -> str:
    """The bound as the start-up line gives it: K, or how `max_staleness: auto` starts and where it may go."""
    b = cfg.buffer
    return f"auto (from {b.max_staleness}, up to {b.max_staleness_cap})" if b.max_staleness_auto else str(b.max_staleness)
