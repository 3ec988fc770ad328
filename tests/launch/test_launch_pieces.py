"""Launch helpers: resource validation, metrics files, the progress line and the plot command."""

import io
import json
import math

import pytest

from configs.loading import resolve
from launch.cli import main
from launch.loop.metrics import MetricsWriter, read_eval_prompts, read_metrics, save_eval_prompts
from launch.loop.progress import Progress, format_line
from launch.planning.resources import Node, ResourceError, plan

TWO_CORES = [Node("this machine", cpus=2, gpus=0, memory_gib=24)]


def test_32_actors_on_two_cores_is_a_clear_error():
    cfg = resolve("pure", flags={"rollout.num_actors": 32})
    with pytest.raises(ResourceError) as e:
        plan(cfg, TWO_CORES)
    msg = str(e.value)
    # what was asked, what exists, what to change
    assert "32 actor(s) × [0.5 CPU + ~2.5 GiB]" in msg and "1 learner rank(s) × [1 CPU + ~1 GiB]" in msg
    assert "nodes: this machine: 2 CPU, 0 GPU, 24.0 GiB" in msg
    # the rank takes 1 core and 1 GiB; 1 core / 0.5 = 2 actors fit beside it
    assert "room for the learner ranks but for only 2 of the 32 actors" in msg
    assert "16 CPU needed, 1 free" in msg  # 32 × 0.5 CPU
    assert "80 GiB of memory needed, 23 free" in msg  # 32 × (1 KV + 1.5) = 80 GiB; 24 − 1 (rank)
    assert "Fix: --actors 2 or" in msg and "--ray-address" in msg


def test_quickstart_fits_two_cores_and_gpu_requests_need_gpus():
    assert plan(resolve("grpo"), TWO_CORES).layout == (("this machine", 1, 1),)  # 0.5 + 1 CPU
    assert plan(resolve("grpo", flags={"rollout.num_actors": 2}), TWO_CORES).layout == (("this machine", 1, 2),)  # 2 × 0.5 + 1 = 2
    with pytest.raises(ResourceError) as e:
        plan(resolve("grpo", overrides=["learner.gpus_per_rank=1"]), TWO_CORES)
    assert "room for only 0 of the 1 learner ranks (1 GPU needed, 0 free)" in str(e.value)
    assert "learner.gpus_per_rank=auto" in str(e.value)


def test_metrics_jsonl_and_tensorboard(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=True)
    w.write(1, {"reward/mean": 0.5, "loss/total": math.nan})
    w.write(2, {"reward/mean": 0.75, "eval/accuracy": 0.4})
    w.close()
    rows = read_metrics(tmp_path)
    assert rows == [{"step": 1, "reward/mean": 0.5, "loss/total": None},
                    {"step": 2, "reward/mean": 0.75, "eval/accuracy": 0.4}]
    assert any((tmp_path / "tb").iterdir())
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a crash mid-line must not break readers
        f.write('{"step": 3, "rew')
    assert len(read_metrics(tmp_path)) == 2
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])


def test_eval_prompts_are_saved_per_evaluation_and_the_last_line_of_a_step_wins(tmp_path):
    # step 0, step 10, then a resume from step 0 evaluates step 10 again with another model: its line wins
    save_eval_prompts(tmp_path, 0, [[0, 0.0], [1, 1.0]])
    save_eval_prompts(tmp_path, 10, [[0, 1.0], [1, 1.0]])
    save_eval_prompts(tmp_path, 10, [[0, 0.0], [1, 1.0]])
    with open(tmp_path / "eval_prompts.jsonl", "a") as f:
        f.write('{"step": 20, "prompt_in')  # a crash mid-line
    assert read_eval_prompts(tmp_path) == {0: {0: 0.0, 1: 1.0}, 10: {0: 0.0, 1: 1.0}}


def test_progress_line_live_and_plain():
    m = {"throughput/samples_per_s": 41.27, "reward/mean": 0.531, "staleness/mean": 0.8, "staleness/max": 2}
    line = format_line(12, 60, m, elapsed=60.0)
    # ETA: 60 s for 12 steps -> 5 s/step × 48 remaining = 240 s = 4m00s
    assert line == "step 12/60 | 41.3 samples/s | reward 0.53 | eval - | stale 0.8/2 | ETA 4m00s"
    plain = io.StringIO()
    p = Progress(60, mode="plain", stream=plain)
    p.update(1, {"eval/accuracy": 0.5})
    p.update(2, {})  # the last eval accuracy is carried forward
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and "eval 0.50" in lines[1] and "\r" not in plain.getvalue()
    live = io.StringIO()
    Progress(60, mode="bar", stream=live).update(1, {})
    assert live.getvalue().startswith("\r\x1b[2K")


def test_plot_command_writes_png(tmp_path, monkeypatch):
    """The x-axis of every panel is the learner step: a metrics row is one learner step (a weight push),
    `mini_batches × epochs` optimiser steps (PACS's preset takes 4 a row)."""
    from matplotlib.figure import Figure

    xlabels, savefig = [], Figure.savefig

    def recording_savefig(fig, *args, **kwargs):
        xlabels.extend(ax.get_xlabel() for ax in fig.axes)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    for name, acc in (("a", 0.3), ("b", 0.6)):
        w = MetricsWriter(tmp_path / name, tensorboard=False)
        for s in range(1, 4):
            w.write(s, {"reward/mean": acc + 0.1 * s, "eval/accuracy": acc, "staleness/mean": 1.0})
        w.close()
    out = tmp_path / "curves.png"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert xlabels == ["learner step"] * 3
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_impossible_request_exits_fast_from_the_command_line(tmp_path):
    import subprocess
    import sys
    import time
    from pathlib import Path

    from launch.planning.resources import local_node

    if local_node().cpus >= 17:
        pytest.skip("this machine could host 32 half-core actors")
    exe = Path(sys.executable).with_name("algo-train")
    t0 = time.monotonic()
    proc = subprocess.run([str(exe), "--algo", "pure", "--actors", "32", "--output", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert "cannot start this run" in proc.stderr and "--actors" in proc.stderr
    assert elapsed < 30, f"took {elapsed:.1f}s"
    assert not (tmp_path / "run").exists(), "nothing may start (not even the run folder) before the check"


def test_a_local_ray_too_busy_to_start_is_retried_then_refused_in_one_line():
    from launch.planning.cluster import start_local_ray
    from launch.planning.resources import ResourceError

    calls = []

    def busy():
        calls.append("start")
        raise Exception("The current node timed out during startup. This could happen because ...")

    with pytest.raises(ResourceError, match="did not register within Ray's 30 s, 2 times"):
        start_local_ray(busy, lambda: calls.append("stop"))
    assert calls == ["start", "stop", "start", "stop"]
    calls.clear()
    outcomes = iter([Exception("The current node timed out during startup."), None])

    def second_time_lucky():
        calls.append("start")
        if (e := next(outcomes)) is not None:
            raise e

    start_local_ray(second_time_lucky, lambda: calls.append("stop"))
    assert calls == ["start", "stop", "start"]
    with pytest.raises(ValueError):  # anything else is not Ray's start-up timeout: raised as it is
        start_local_ray(lambda: (_ for _ in ()).throw(ValueError("bad")), lambda: None)


def test_a_resume_may_change_how_the_staleness_bound_is_chosen_and_the_start_line_says_auto():
    from configs.loading import resolve
    from launch.commands.train import staleness_text
    from launch.state.rundir import resume_safe

    assert resume_safe("buffer.max_staleness_auto") and resume_safe("buffer.max_staleness_cap")
    assert staleness_text(resolve("grpo", overrides=["buffer.max_staleness=auto"])) == "auto (from 1, up to 4)"
    assert staleness_text(resolve("grpo", overrides=["buffer.max_staleness=3"])) == "3"
