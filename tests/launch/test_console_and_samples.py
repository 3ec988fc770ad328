"""The console and the run's user-facing outputs: the ETA from the first step, metric lines every
`logging.log_every`, summary.json and the last line, samples.jsonl, and `algo-train eval`'s scoring."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

from buffer.records import Group, Sample
from launch.commands.evaluate import build_parser, by_source, eval_config, ks_for, pass_at_k, summarize, table
from launch.commands.evaluate import main as eval_main
from launch.loop import progress as progress_mod
from launch.loop.metrics import MetricsWriter, done_line, read_metrics, run_summary
from launch.loop.progress import Progress, fmt_duration
from launch.loop.samples import SampleLog, markdown, pick, record


def test_eta_counts_training_only(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    p = Progress(60, mode="plain", stream=out)
    clock[0] = 100.0  # 100 s of start-up (model, Ray, engines, the evaluation before RL)
    p.update(1, {})
    clock[0] = 110.0
    p.update(2, {})
    first, second = out.getvalue().splitlines()
    assert first.endswith("ETA ?")  # one step seen: no rate yet
    # 10 s for the 1 step since the first → 58 steps left × 10 s = 580 s (not 110 s / 2 steps × 58 = 3190 s)
    assert second.endswith("ETA 9m40s")
    assert p.elapsed() == 110.0 and p.training_s() == 10.0


def test_plain_lines_every_log_every_steps_and_the_last():
    out = io.StringIO()
    p = Progress(10, mode="plain", stream=out)
    for step in range(1, 11):
        p.update(step, {"eval/accuracy": 0.5} if step == 3 else {}, every=4)
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["4/10", "8/10", "10/10"]
    assert "eval 0.50" in lines[0]  # seen at step 3, shown at step 4
    live = io.StringIO()
    Progress(10, mode="bar", stream=live).update(3, {}, every=4)  # a live line is redrawn every step
    assert live.getvalue().startswith("\r\x1b[2K")
    assert fmt_duration(3725) == "1h02m" and fmt_duration(float("nan")) == "?"


def test_a_resumed_run_rewrites_its_later_steps_and_keeps_the_best_eval(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=False)
    for step, acc in [(0, 0.2), (1, None), (2, 0.5), (3, None), (4, 0.4), (5, None)]:
        w.write(step, {"reward/mean": 0.1} | ({"eval/accuracy": acc} if acc is not None else {}))
    w.close()
    w = MetricsWriter(tmp_path, tensorboard=False, from_step=3)  # the checkpoint was at step 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    w.write(4, {"eval/accuracy": 0.5})
    w.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    # final: step 4's 0.5; best: 0.5 first reached at step 2 (the earliest of equal accuracies)
    assert w.eval_summary() == {"final_eval_accuracy": 0.5, "final_eval_step": 4, "best_eval_accuracy": 0.5,
                                "best_eval_step": 2}
    assert MetricsWriter(tmp_path / "new", tensorboard=False).eval_summary()["final_eval_accuracy"] is None


def test_summary_leads_with_results_and_the_last_line_says_them():
    s = run_summary(algo="grpo", step=40, steps=40, stopped_early=False, elapsed_s=312.04, training_s=250.0,
                    checkpoint="/r/checkpoints/step_40", model="/r/hf/step_40",
                    evals={"final_eval_accuracy": 0.61, "final_eval_step": 40, "best_eval_accuracy": 0.63,
                           "best_eval_step": 30},
                    internals={"version": 40, "driver_pid": 7, "buffer": {"auth": {"refused": 0}}})
    assert list(s)[:5] == ["algo", "step", "steps", "stopped_early", "final_eval_accuracy"]
    assert list(s)[-3:] == ["version", "driver_pid", "buffer"] and s["elapsed_s"] == 312.0
    assert done_line(s) == ("[done] 40 steps in 5m12s (training 4m10s); held-out accuracy 0.610 (step 40), "
                            "best 0.630 at step 30; model /r/hf/step_40")
    stopped = s | {"step": 12, "stopped_early": True, "model": None, "final_eval_accuracy": None}
    assert done_line(stopped) == "[done] stopped at step 12 of 40 in 5m12s (training 4m10s); checkpoint " \
                                 "/r/checkpoints/step_40"


def sample(reward: float, tokens: list[int], versions: list[int], finish: str = "stop", prefix: int = 0) -> Sample:
    n = len(tokens)
    return Sample(tokens=np.asarray(tokens, dtype=np.int32), logprobs=np.zeros(n, dtype=np.float32),
                  versions=np.asarray(versions, dtype=np.int32),
                  prefix_mask=np.arange(n) < prefix, reward=reward, finish_reason=finish)


def group(i: int, samples: list[Sample]) -> Group:
    return Group(group_id=f"g{i}", prompt_index=i, prompt_tokens=np.asarray([100 + i], dtype=np.int32),
                 samples=samples, ground_truth=str(i), data_source="arith")


def test_pick_spreads_over_groups_and_shows_a_success_and_a_failure():
    groups = [group(i, [sample(0.0, [1], [3]), sample(1.0, [2], [3])]) for i in range(4)]
    groups.insert(1, group(9, [sample(1.0, [5], [-1], finish="demo")]))  # a demonstration-only group
    chosen = pick(groups, 2)
    # 4 groups with generated rows, 2 to show: positions ⌊0·4/2⌋ = 0 and ⌊1·4/2⌋ = 2 → prompts 0 and 2;
    # the first the best sample (reward 1), the second the worst (reward 0)
    assert [(g.prompt_index, s.reward) for g, s in chosen] == [(0, 1.0), (2, 0.0)]
    assert len(pick(groups[:1], 3)) == 1 and pick([groups[1]], 2) == []


def test_a_sample_record_and_the_log_every_n_steps(tmp_path):
    def decode(ids):
        return " ".join(f"t{i}" for i in ids)

    guided = sample(1.0, [7, 8, 9], [-1, 4, 5], prefix=1)
    rec = record(6, group(3, [guided]), guided, decode)
    assert rec == {"step": 6, "version": 4, "prompt_index": 3, "data_source": "arith", "prompt": "t103",
                   "response": "t7 t8 t9", "ground_truth": "3", "reward": 1.0, "finish_reason": "stop",
                   "response_tokens": 3, "guided_prefix_tokens": 1}
    assert "**reward 1** (version 4, stop, 3 tokens; expected `3`)" in markdown([rec])
    texts = []
    log = SampleLog(tmp_path, every=2, per_step=1, model_dir="unused", text_sink=lambda *a: texts.append(a))
    log._decode = decode  # no tokenizer needed here
    batch = [group(0, [sample(0.5, [1, 2], [0, 0])])]
    failed = [group(1, [sample(0.0, [3], [0]), sample(0.0, [4], [0])])]  # every generated sample scored 0
    assert log.write(3, batch) == []  # not a sampled step
    assert [r["step"] for r in log.write(1, batch) + log.write(2, batch) + log.write(4, batch)] == [1, 2, 4]
    assert [r["step"] for r in log.write(5, failed)] == [5]  # all 0: shown whatever the cadence
    assert [t[0] for t in texts] == ["samples"] * 4 and texts[2][2] == 4
    again = SampleLog(tmp_path, every=2, per_step=1, model_dir="unused", from_step=3)  # resumed at step 3
    assert again.path == tmp_path / "samples.jsonl"
    assert [json.loads(line)["step"] for line in again.path.read_text().splitlines()] == [1, 2]
    assert SampleLog(tmp_path, every=0, per_step=1, model_dir="unused").write(1, failed) == []  # 0 = never


def test_pass_at_k_unbiased_estimator():
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5; pass@4 = 1 (3 wrong < 4)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    # n = 5, c = 2, k = 3: 1 − C(3,3)/C(5,3) = 1 − 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


def test_eval_metrics_per_data_source():
    prompts = [{"data_source": "a", "correct": 1, "mean_reward": 0.25}, {"data_source": "a", "correct": 4,
                                                                         "mean_reward": 1.0},
               {"data_source": "", "correct": 0, "mean_reward": 0.0}]
    res = by_source(prompts, 4)
    assert list(res) == ["-", "a", "all"]
    # a: accuracy (1/4 + 4/4)/2 = 0.625; pass@2 (0.5 + 1)/2 = 0.75; pass@4 (1 + 1)/2 = 1
    assert res["a"] == pytest.approx({"prompts": 2, "accuracy": 0.625, "pass@1": 0.625, "pass@2": 0.75,
                                      "pass@4": 1.0, "mean_reward": 0.625})
    # all: accuracy (0.25 + 1 + 0)/3 = 0.41667; pass@4 (1 + 1 + 0)/3 = 0.66667
    assert res["all"]["accuracy"] == pytest.approx(1.25 / 3) and res["all"]["pass@4"] == pytest.approx(2 / 3)
    assert summarize([], 4) == {"prompts": 0}
    text = table(res, 4)
    assert text.splitlines()[0].split() == ["data_source", "prompts", "accuracy", "pass@1", "pass@2", "pass@4",
                                            "mean_reward"]
    assert text.splitlines()[2].split() == ["a", "2", "0.625", "0.625", "0.750", "1.000", "0.625"]


def test_eval_arguments_are_checked_before_anything_starts(tmp_path, capsys):
    model = tmp_path / "m"
    model.mkdir()
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    assert eval_main(["--model", str(model), "--data", str(data)]) == 2
    assert "--model " + str(model) + ": not a HF model directory (no config.json)" in capsys.readouterr().err
    (model / "config.json").write_text("{}")
    assert eval_main(["--model", str(model), "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "--data: no such file" in capsys.readouterr().err
    assert eval_main(["--model", str(model), "--data", str(data), "--n", "0"]) == 2
    assert "--n: samples per prompt must be at least 1" in capsys.readouterr().err
    assert eval_main(["--model", str(model), "--data", str(data), "--set", "rollout.max_response_tokens=0"]) == 2
    assert "rollout.max_response_tokens" in capsys.readouterr().err
    cfg = eval_config(build_parser().parse_args(["--model", str(model), "--data", str(data), "--n", "4",
                                                 "--set", "reward.fn=math_verify"]))
    assert cfg.model.path == str(model) and cfg.data.path == str(data) and cfg.data.task == "file"
    assert cfg.reward.fn == "math_verify"


def test_a_shut_down_engine_collected_at_interpreter_exit_raises_nothing(monkeypatch):
    """vLLM's `AsyncLLM.__del__` calls `shutdown()` again when the engine is collected; at interpreter exit the
    module globals that shutdown calls are already None, which printed "Exception ignored in AsyncLLM.__del__
    ... TypeError" at the end of every `algo-train eval`. Modelled here: the engine class of vLLM 0.32 reduced
    to those two methods, in a module whose global is then set to None as the interpreter's teardown does."""
    import gc
    import sys
    import textwrap
    import types

    from actors.engine import shutdown_engine

    vllm_like = types.ModuleType("vllm_like")
    exec(textwrap.dedent("""
        calls = []

        def shutdown_prometheus():
            calls.append("shutdown")

        class AsyncLLM:
            def shutdown(self, timeout=None):
                shutdown_prometheus()

            def __del__(self):
                self.shutdown()
    """), vllm_like.__dict__)
    engine = vllm_like.AsyncLLM()
    shutdown_engine(engine)
    shutdown_engine(engine)  # idempotent
    assert vllm_like.calls == ["shutdown"]
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    vllm_like.shutdown_prometheus = None  # what interpreter teardown does to the module's globals
    del engine
    gc.collect()
    assert unraisable == []


@pytest.mark.slow
def test_eval_ends_without_a_shutdown_traceback(tmp_path):
    """`algo-train eval` as a user runs it (its own process and vLLM engine, the tiny model): the table, the
    JSON, exit 0, and nothing from the engine's teardown on stderr (`actors.engine.shutdown_engine`)."""
    import subprocess
    import sys
    from pathlib import Path

    from tasks.arithmetic import sample_problems
    from tasks.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    data = tmp_path / "held_out.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": p.prompt}],
                                        "reward_model": {"ground_truth": p.answer}}) + "\n"
                            for p in sample_problems(4, split="eval", seed=3)))
    exe = Path(sys.executable).with_name("algo-train")
    proc = subprocess.run([str(exe), "eval", "--model", str(model), "--data", str(data), "--n", "2",
                           "--json", str(tmp_path / "out.json"), "--set", "rollout.max_response_tokens=8"],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-4000:]
    assert "data_source" in proc.stdout and json.loads((tmp_path / "out.json").read_text())["n"] == 2


def test_wandb_offline_gets_the_same_scalars_as_tensorboard(tmp_path, monkeypatch):
    """logging.wandb: the metrics rows' scalars go to a W&B run (offline here: files under run_dir/wandb)
    whose id is kept in run_dir/wandb_id, so a resumed run continues it."""
    pytest.importorskip("wandb")
    from configs.schema import RunConfig
    from launch.loop.metrics import wandb_init

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = RunConfig(logging={"wandb": True, "wandb_project": "test-project"})
    init = wandb_init(cfg, tmp_path)
    assert init["id"] == (tmp_path / "wandb_id").read_text() and init["dir"] == str(tmp_path)
    assert wandb_init(cfg, tmp_path)["id"] == init["id"]  # a resume continues the same W&B run
    assert wandb_init(RunConfig(), tmp_path) is None  # off by default
    w = MetricsWriter(tmp_path, tensorboard=False, wandb=init)
    w.write(1, {"reward/mean_xyz": 0.25, "eval/accuracy": None, "text/not_a_scalar": "words"})
    w.write(2, {"reward/mean_xyz": 0.5})
    w.close()
    # the offline run's record log (protobuf records in a block log; keys and JSON values are stored as is)
    (log,) = tmp_path.glob(f"wandb/offline-run-*-{init['id']}/run-{init['id']}.wandb")
    deadline = time.monotonic() + 60  # W&B's own writer process may still be flushing after finish() (seen in CI)
    while log.read_bytes().count(b"reward/mean_xyz") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    data = log.read_bytes()
    assert data.count(b"reward/mean_xyz") >= 2 and b"text/not_a_scalar" not in data
