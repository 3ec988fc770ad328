"""Run folders and resume (launch.state.rundir, launch.cli): an existing run is never mixed with a new one,
`--resume DIR` alone continues with DIR's config, changes are applied and recorded or refused by name,
and a finished run says so at once. No Ray, no vLLM: the run folders are made by hand."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from configs.loading import ConfigError, dump_annotated, resolve, resolve_saved
from launch.cli import main, parse
from launch.state.rundir import check_new_run_dir, checkpoint_step, clear_run_dir
from launch.state.storage import absolutize


def make_run(run: Path, step: int | None, steps: int = 10, sets: tuple[str, ...] = ()) -> None:
    """A run folder as a run leaves it: its config.yaml (steps `steps`) and a committed checkpoint at `step`."""
    cfg = absolutize(resolve("grpo", flags={"learner.steps": steps, "logging.output_dir": str(run)},
                             overrides=list(sets)), run.parent)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_annotated(cfg) + "\n")
    (run / "metrics.jsonl").write_text("")
    if step is not None:
        (run / "checkpoints" / f"step_{step}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step}" / "COMMITTED").write_text(f"step_{step}\n")
    (run / "checkpoints" / ".step_99.tmp").mkdir(parents=True)  # a crashed save: never counted


def test_checkpoint_step_counts_committed_checkpoints_only(tmp_path):
    make_run(tmp_path / "r", 5)
    (tmp_path / "r" / "checkpoints" / "step_8").mkdir()  # no COMMITTED marker: incomplete
    assert checkpoint_step(tmp_path / "r") == 5
    assert checkpoint_step(tmp_path / "missing") is None


def test_force_starts_a_run_folder_over(tmp_path):
    run = tmp_path / "r"
    make_run(run, 5)
    check_new_run_dir(run, force=True)  # allowed; the contents go only when the run really starts
    clear_run_dir(run)
    assert run.is_dir() and not any(run.iterdir())
    check_new_run_dir(run, force=False)  # an empty folder is fine


def test_the_same_command_again_continues_its_run(tmp_path, monkeypatch):
    """A Slurm requeue re-runs the job's line: the run in --output goes on from its checkpoint, with a
    one-line notice, as `--resume` would; a larger --steps trains longer."""
    from launch.commands.train import resume_lines

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "r"
    make_run(run, 5, steps=10, sets=("learner.lr=3e-5",))
    line = ["--algo", "grpo", "--output", "r", "--steps", "10", "--set", "learner.lr=3e-5"]
    _, cfg, plan = parse(line)
    assert plan.rerun and plan.step == 5 and plan.changes == {} and not plan.finished
    assert cfg.resume == str(run) and cfg.learner.lr == 3e-5 and [r.step for r in cfg.resumed] == [5]
    assert resume_lines(plan, run) == [f"[resume] {run} holds this command's run (--force starts it over): "
                                       "continuing it from step 5 to step 10: no changes"]
    _, cfg, plan = parse([*line[:5], "20", *line[6:], "--actors", "2"])
    assert plan.changes == {"rollout.num_actors": [1, 2], "learner.steps": [10, 20],
                            "learner.lr_horizon_steps": [None, 20]}  # the cosine stretched, as --resume --steps
    _, cfg, plan = parse([*line, "--force"])
    assert plan is None and cfg.resume is None  # --force: a new run, over the old one


def test_a_requeued_line_matches_the_config_the_cluster_decided(tmp_path, monkeypatch):
    """config.yaml records what the cluster decided ("auto" -> float32, gloo, chunk sizes; KV cache null ->
    1 GiB on CPU) and a fitted warm-up (3 optimiser steps for --steps 3): the same line again is the same
    run, and a longer one keeps the run's warm-up."""
    from launch.planning.resources import Node, resolve_auto

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "r"
    make_run(run, 2, steps=3)
    cpu = resolve_auto(resolve_saved(run / "config.yaml"), [Node("127.0.0.1", 2, 0, 24, {})])
    (run / "config.yaml").write_text(dump_annotated(cpu) + "\n")
    assert (cpu.model.dtype, cpu.weight_sync.backend, cpu.rollout.kv_cache_gib) == ("float32", "gloo", 1.0)
    assert cpu.learner.warmup_steps == 3  # grpo.yaml's 10, fitted to 3 steps × 1 × 1
    _, cfg, plan = parse(["--algo", "grpo", "--output", "r", "--steps", "3"])
    assert plan.rerun and plan.changes == {} and cfg.model.dtype == "float32"
    _, cfg, plan = parse(["--algo", "grpo", "--output", "r", "--steps", "5"])
    assert plan.changes == {"learner.steps": [3, 5], "learner.lr_horizon_steps": [None, 5]}
    assert cfg.learner.warmup_steps == 3


def test_a_different_configuration_in_output_is_refused_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "r"
    make_run(run, 5, steps=10, sets=("learner.lr=3e-5",))
    assert main(["--algo", "grpo", "--output", "r", "--steps", "10", "--set", "rollout.n=4"]) == 2
    assert capsys.readouterr().err == (
        "algo-train: --output r: holds a run of another configuration: rollout.n (run: 8, this command: 4); "
        "learner.lr (run: 3.0e-05, this command: 0.0001) — continue that run as it is with --resume r, start it "
        "over with --force (deletes its contents), or choose another --output\n")
    with pytest.raises(ConfigError, match=r"another configuration: algo \(run: grpo, this command: pure\)"):
        parse(["--algo", "pure", "--output", "r"])
    with pytest.raises(ConfigError, match="model.cache_dir"):  # relative paths mean another folder elsewhere
        monkeypatch.chdir(run)
        parse(["--algo", "grpo", "--output", str(run), "--steps", "10", "--set", "learner.lr=3e-5"])


def test_a_finished_run_run_again_says_so_and_one_without_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "done", 10, steps=10)
    assert main(["--algo", "grpo", "--output", "done", "--steps", "10"]) == 0
    assert f"[done] {tmp_path / 'done'} is finished: step 10 of 10" in capsys.readouterr().out
    make_run(tmp_path / "early", None)
    with pytest.raises(ConfigError, match="--output early: holds a run that stopped before its first checkpoint, "
                                          "so there is nothing to continue — start it over with --force"):
        parse(["--algo", "grpo", "--output", "early", "--steps", "10"])
    assert parse(["--algo", "grpo", "--output", "early", "--force"])[2] is None


def test_force_never_deletes_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty and holds no run — choose a new or empty folder"):
        check_new_run_dir(tmp_path, force=True)
    clear_run_dir(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_resume_alone_continues_with_the_runs_own_config(tmp_path):
    run = tmp_path / "r"
    make_run(run, 4, steps=10, sets=("learner.lr=3e-5",))
    args, cfg, plan = parse(["--resume", str(run)])
    assert cfg.algo == "grpo" and cfg.learner.lr == 3e-5 and cfg.learner.steps == 10  # not grpo.yaml's 1e-4, 350
    assert cfg.resume == str(run) and plan.step == 4 and plan.changes == {} and not plan.finished
    assert [r.model_dump() for r in cfg.resumed] == [{"step": 4, "changes": {}}]
    assert cfg.learner.lr_horizon_steps is None  # steps unchanged: the schedule is untouched


def test_safe_changes_apply_and_are_recorded_with_their_step(tmp_path):
    run = tmp_path / "r"
    make_run(run, 4, steps=10, sets=("learner.lr_schedule=constant",))
    _, cfg, plan = parse(["--resume", str(run), "--max-staleness", "3", "--steps", "20",
                          "--set", "learner.eval_every=5", "--set", "logging.samples_every=1"])
    assert plan.changes == {"buffer.max_staleness": [1, 3], "learner.steps": [10, 20],
                            "buffer.max_staleness_auto": [True, False],  # the presets' auto, fixed by the flag
                            "learner.lr_horizon_steps": [None, 10],  # pinned to the run's old steps
                            "learner.eval_every": [25, 5], "logging.samples_every": [10, 1]}
    assert cfg.buffer.max_staleness == 3 and cfg.learner.steps == 20
    # written to config.yaml, the record reads back; a second resume appends to it
    (run / "config.yaml").write_text(dump_annotated(cfg) + "\n")
    saved = resolve_saved(run / "config.yaml")
    assert saved.resumed[-1].step == 4 and saved.resumed[-1].changes["buffer.max_staleness"] == [1, 3]
    (run / "checkpoints" / "step_12").mkdir()
    (run / "checkpoints" / "step_12" / "COMMITTED").write_text("step_12\n")
    _, again, _ = parse(["--resume", str(run)])
    assert [r.step for r in again.resumed] == [4, 12] and again.learner.steps == 20


def test_unsafe_changes_are_refused_by_name(tmp_path, capsys):
    run = tmp_path / "r"
    make_run(run, 4)
    assert main(["--resume", str(run), "--set", "learner.lr=1e-3", "--set", "rollout.n=4",
                 "--max-staleness", "2"]) == 2
    err = capsys.readouterr().err
    assert "a resume cannot change rollout.n (run: 8, asked: 4); learner.lr (run: 0.0001, asked: 0.001) — it " \
           "would train a different run" in err
    assert "buffer.max_staleness (" not in err  # that one may change
    with pytest.raises(ConfigError, match="--algo: the run in .* is grpo, not pure"):
        parse(["--resume", str(run), "--algo", "pure"])
    with pytest.raises(ConfigError, match="--output .*: a resumed run writes into its own folder"):
        parse(["--resume", str(run), "--output", str(tmp_path / "elsewhere")])
    assert parse(["--resume", str(run), "--output", str(run), "--algo", "grpo"])[1].resume == str(run)
    with pytest.raises(ConfigError, match="--config: a resumed run continues with"):
        parse(["--resume", str(run), "--config", str(run / "config.yaml")])
    with pytest.raises(ConfigError, match="--force starts .* over and --resume continues it"):
        parse(["--resume", str(run), "--force"])


def test_steps_alone_extends_a_decaying_schedule(tmp_path):
    """--resume DIR --steps N trains longer with no other flag: a cosine schedule that ended with the run
    is stretched to end at step N; a shorter run keeps its curve; an explicit horizon is the user's."""
    run = tmp_path / "r"
    make_run(run, 10, steps=10)  # grpo.yaml: cosine to lr 0 at the run's end
    _, cfg, plan = parse(["--resume", str(run), "--steps", "30"])
    assert cfg.learner.lr_horizon_steps == 30 and plan.changes["learner.lr_horizon_steps"] == [None, 30]
    short = tmp_path / "s"
    make_run(short, 4, steps=20)
    _, cfg, _ = parse(["--resume", str(short), "--steps", "12"])
    assert cfg.learner.lr_horizon_steps == 20  # pinned: the steps still to come keep the run's curve
    _, cfg, _ = parse(["--resume", str(run), "--steps", "30", "--set", "learner.lr_horizon_steps=40"])
    assert cfg.learner.lr_horizon_steps == 40
    with pytest.raises(ConfigError, match="learner.lr_horizon_steps: the cosine LR schedule reaches lr 0 at step 20, "
                                          "so steps 21–30 of learner.steps=30 would train at lr 0"):
        parse(["--resume", str(run), "--steps", "30", "--set", "learner.lr_horizon_steps=20"])


def test_the_quickstart_extended_to_700_steps_announces_its_lr(tmp_path):
    """The quick-start (cosine, peak 1e-4, warm-up 10, 1 optimiser step per learner step) finished at
    350, resumed with --steps 700. The next optimiser step is 350 (0-based): with horizon 350 it is past
    the end, lr 0; with horizon 700, p = (350 - 10) / (700 - 10) = 0.49275, lr = 1e-4 · ½(1 + cos πp)
    = 1e-4 · ½(1 + 0.022759) = 5.1138e-05."""
    from launch.commands.train import resume_lines
    from learner.optim import lr_at

    run = tmp_path / "q"
    make_run(run, 350, steps=350)
    _, cfg, plan = parse(["--resume", str(run), "--steps", "700"])
    assert cfg.learner.lr_horizon_steps == 700
    assert resume_lines(plan, run)[1] == ("[resume] the cosine LR schedule now ends at step 700 instead of 350 (its "
                                         "decay stretched to the new end): lr at the next optimiser step 0 -> 5.11e-05")
    lc = cfg.learner
    assert lr_at(350, peak=lc.lr, warmup=lc.warmup_steps, total=700, schedule=lc.lr_schedule) == pytest.approx(
        5.1138e-05, rel=1e-4)


def test_the_lr_jump_of_a_stretched_schedule_is_announced(tmp_path):
    from launch.commands.train import resume_lines

    run = tmp_path / "r"
    make_run(run, 10, steps=10, sets=("learner.warmup_steps=0",))
    _, _, plan = parse(["--resume", str(run), "--steps", "20", "--set", "learner.lr_horizon_steps=20"])
    lines = resume_lines(plan, run)
    assert lines[0] == (f"[resume] {run} from step 10 to step 20: learner.steps 10 -> 20, "
                        "learner.lr_horizon_steps null -> 20")
    # lr at optimiser step 10: old horizon 10 → p = 1, lr 0; new horizon 20 → p = 0.5,
    # 1e-4 · ½(1 + cos π/2) = 5e-5
    assert lines[1].endswith("lr at the next optimiser step 0 -> 5e-05")


def test_a_finished_run_says_so_without_starting_anything(tmp_path):
    run = tmp_path / "r"
    make_run(run, 10, steps=10)
    (run / "summary.json").write_text(json.dumps({"final_eval_accuracy": 0.61, "best_eval_accuracy": 0.63,
                                                  "best_eval_step": 5}))
    exe = Path(sys.executable).with_name("algo-train")
    t0 = time.monotonic()
    proc = subprocess.run([str(exe), "--resume", str(run)], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert f"[done] {run} is finished: step 10 of 10; final eval accuracy 0.610, best 0.630 at step 5" in proc.stdout
    assert f"To train longer: algo-train --resume {run} --steps N (N > 10)" in proc.stdout
    print(f"finished-run answer: {took:.2f} s")  # the fast path imports neither torch nor Ray
    # the same answer through the full planning (e.g. with --dry-run skipped: steps equal to the saved ones)
    assert parse(["--resume", str(run), "--steps", "10"])[2].finished
    with pytest.raises(ConfigError, match="learner.steps: the run in .* is at step 10 already — pass --steps larger"):
        parse(["--resume", str(run), "--steps", "8"])


def test_the_fast_path_leaves_a_steps_key_under_any_accepted_name_to_the_full_planning():
    from launch.cli import _sets_steps

    # veRL's trainer.total_training_steps is read as learner.steps: the run is to go longer, not "finished"
    assert _sets_steps("learner.steps=20") and _sets_steps("trainer.total_training_steps = 20")
    assert not _sets_steps("learner.save_every=20") and not _sets_steps("max_steps=20")  # TRL's: refused later


def test_the_fast_path_imports_no_training_stack(tmp_path):
    run = tmp_path / "r"
    make_run(run, 10, steps=10)
    code = ("import sys; from launch.cli import main; main(['--resume', sys.argv[1]]); "
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout
    # the config loader's schema (with the torch-free algorithm registry it builds from), nothing heavier
    assert out.strip().splitlines()[-1] == "['pydantic']"


def test_resume_needs_a_checkpoint_and_a_run_folder(tmp_path):
    make_run(tmp_path / "r", None)
    with pytest.raises(ConfigError, match="no complete checkpoint under .* start it over: --output .* --force"):
        parse(["--resume", str(tmp_path / "r")])
    with pytest.raises(ConfigError, match="not a run folder"):
        parse(["--resume", str(tmp_path)])


def test_after_a_stop_the_exact_resume_command_is_printed(tmp_path):
    from launch.commands.train import after_run

    make_run(tmp_path / "r", 6)
    run = tmp_path / "r"
    assert after_run(130, run) == f"[stop] the run stopped; continue from step 6: algo-train --resume {run}"
    assert after_run(1, run) == (f"[stop] the run failed (exit status 1); continue from step 6 once the cause is "
                                 f"fixed: algo-train --resume {run}")
    assert after_run(0, run) is None and after_run(2, run) is None
    empty = tmp_path / "e"
    empty.mkdir()
    assert "before its first checkpoint; start it over: --output" in after_run(130, empty)


def test_max_restarts_resumes_a_run_whose_learner_died_from_its_last_checkpoint(tmp_path):
    """--max-restarts N: a run stopped by a dead learner rank resumes itself from its last checkpoint,
    as --resume would, at most N times; any other stop is final."""
    from launch.commands.supervisor import LEARNER_DIED
    from launch.commands.train import restart_after_learner_deaths

    run = tmp_path / "r"
    make_run(run, 6)
    cfg = resolve("grpo", flags={"max_restarts": 2}, overrides=["learner.save_every=2"])
    said, runs = [], []

    def supervise(cfg, run_dir, statuses=[LEARNER_DIED, LEARNER_DIED]):  # noqa: B006 - consumed by the calls
        runs.append(cfg)
        return statuses.pop(0)

    assert restart_after_learner_deaths(LEARNER_DIED, cfg, run, supervise, said.append) == LEARNER_DIED
    assert said == [f"[learner] restart 1 of 2: resuming {run} from step 6",
                    f"[learner] restart 2 of 2: resuming {run} from step 6"]
    assert [c.resume for c in runs] == [str(run)] * 2 and runs[0].resumed[-1].step == 6  # what --resume runs
    assert "resumed:" in (run / "config.yaml").read_text()
    assert restart_after_learner_deaths(1, cfg, run, supervise, said.append) == 1  # not a learner death
    assert restart_after_learner_deaths(LEARNER_DIED, resolve("grpo"), run, supervise, said.append) == LEARNER_DIED
    assert len(said) == 2  # max_restarts 0 (the default): no restart


def test_max_restarts_without_checkpoints_on_the_way_is_refused():
    """With learner.save_every=0 (the default) the first checkpoint is written at the end: a learner rank
    death has nothing to resume from, so --max-restarts is refused before start, with the fix."""
    with pytest.raises(ConfigError) as err:
        resolve("grpo", flags={"max_restarts": 2})
    assert ("max_restarts: a restart resumes from the last checkpoint, and with learner.save_every=0 (and "
            "learner.hf_every=0) the first is written at the end, so --max-restarts 2 could never restart anything "
            "— checkpoint as you go: --set learner.save_every=K (e.g. 35)") in str(err.value)
    resolve("grpo", flags={"max_restarts": 2}, overrides=["learner.hf_every=50"])  # a checkpoint with each export


def test_quiet_console_environment(monkeypatch):
    from launch.commands.console import QUIET_ENV, quiet_env

    cfg = resolve("grpo")
    env = quiet_env(cfg, starts_local_ray=True, environ={"TRANSFORMERS_VERBOSITY": "info"})
    assert env["RAY_AUTH_MODE"] == "token" and "TRANSFORMERS_VERBOSITY" not in env  # the user's setting stays
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and "ignore::FutureWarning" in env["PYTHONWARNINGS"]
    assert "RAY_AUTH_MODE" not in quiet_env(cfg, starts_local_ray=False, environ={})  # a joined cluster's own
    assert quiet_env(resolve("grpo", flags={"logging.verbose": True}), True, {}) == {}
    assert set(QUIET_ENV) <= set(quiet_env(cfg, False, {}))
    assert parse(["--algo", "grpo", "--verbose"])[1].logging.verbose is True
    # the config.yaml of a run that kept the default shows it
    assert "verbose: false" in dump_annotated(cfg)
    assert yaml.safe_load(dump_annotated(cfg))["logging"]["verbose"] is False


def test_the_run_folder_rules_answer_without_importing_torch():
    """`algo-train --resume` of a finished run answers at once: the committed-checkpoint rule it reads
    (`learner.committed`, shared with `learner.checkpoint`) imports no torch."""
    code = "import sys, launch.state.rundir; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
