"""The registered verdict rules and measures of bench/evidence/study_tests.py (each study's `registered` text in
bench/evidence/evidence_studies.py): steps-opd's and steps-credit's rule on (S, N) per seed, the training
accuracy on all generated rollouts over a window, window means, the per-prompt paired line beside the
registered tests, and the interim line while seeds are missing, on metrics written by hand."""

import json

import pytest

from bench.evidence.study_tests import (
    generated_windows,
    interim,
    never,
    none_right_word,
    per_prompt_line,
    samples_word,
    window_mean,
    window_se,
)


def test_the_samples_rule_uses_the_four_words_as_registered():
    total = 5120  # steps-opd: GRPO's 80 × 64 samples, the same N on every seed
    assert samples_word([(1280, total), (2560, total), (640, total)]) == "reproduced"  # 2,560 is half: still in
    assert samples_word([(1280, total), (2624, total), (640, total)]) == "direction only"  # one past half
    assert samples_word([(1280, total), (5120, total), (640, total)]) == "inconclusive"  # only at the end on one
    assert samples_word([(None, total)] * 3) == "not reproduced"  # never reached on any seed
    assert samples_word([(1280, total), (None, total), (640, total)]) == "inconclusive"


def test_the_samples_rule_takes_each_seeds_own_n():
    # steps-credit: RLOO's generated samples differ per seed (its filter drops a varying share)
    assert samples_word([(6000, 12000), (7000, 15000)]) == "reproduced"  # 6,000 ≤ 12,000 / 2; 7,000 ≤ 7,500
    assert samples_word([(6001, 12000), (7000, 15000)]) == "direction only"  # 6,001 > 6,000


def _run(tmp_path, rows):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"time/train_s": 1.0, **r}) + "\n" for r in rows))
    return tmp_path


def test_training_accuracy_on_all_generated_rollouts_over_a_window(tmp_path):
    # cumulative generated samples 100 per step, right ones 10, 20, 30, 40 more at steps 1-4
    rows = [{"step": t, "buffer/generated_samples": 100 * t, "buffer/generated_correct": c}
            for t, c in ((1, 10), (2, 30), (3, 60), (4, 100))]
    w = generated_windows(_run(tmp_path, rows), width=2)
    assert w == {2: (pytest.approx(30 / 200), 200),  # steps 1-2: (30 - 0) / (200 - 0)
                 3: (pytest.approx(50 / 200), 300),  # steps 2-3: (60 - 10) / (300 - 100)
                 4: (pytest.approx(70 / 200), 400)}  # steps 3-4: (100 - 30) / (400 - 200)


def test_a_windows_noise_and_a_never_reached_targets_shortfall(tmp_path):
    rows = [{"step": t, "buffer/generated_samples": 100 * t, "buffer/generated_correct": c}
            for t, c in ((1, 10), (2, 30), (3, 60), (4, 100))]
    run = _run(tmp_path, rows)
    # steps 3-4: p = 70 / 200 = 0.35 over n = 200 samples: sqrt(0.35 × 0.65 / 200) = 0.03373
    assert window_se(generated_windows(run, width=2), 4, width=2) == pytest.approx(0.033727, abs=1e-6)
    # width 20 holds no window of a 4-step run; the best 2-step window is that of steps 3-4
    assert never(generated_windows(run, width=2), 0.40) == "never (best window 0.350 at step 4, 0.050 short)"


def test_a_window_mean_reads_only_its_steps(tmp_path):
    rows = [{"step": t, "entropy": e} for t, e in ((1, 1.0), (2, 0.5), (3, None), (4, 0.1))]
    run = _run(tmp_path, rows)
    assert window_mean(run, "entropy", 1, 2) == pytest.approx(0.75)  # (1.0 + 0.5) / 2
    assert window_mean(run, "entropy", 3, 4) == pytest.approx(0.1)  # step 3 holds no value
    assert window_mean(run, "entropy", 5, 9) is None


def test_the_per_prompt_line_pairs_each_prompt_averaged_over_the_seeds(tmp_path, capsys):
    from types import SimpleNamespace

    final = {("pacs", 0): [1, 1, 0, 0], ("pacs", 1): [1, 0, 0, 0], ("grpo", 0): [1, 0, 0, 0], ("grpo", 1): [0, 0, 0, 0]}
    for (arm, seed), rewards in final.items():
        run = tmp_path / "study" / f"{arm}-s{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"stopped_early": False}))
        (run / "eval_prompts.jsonl").write_text(  # step 0 is not the final model; step 10 is
            json.dumps({"step": 0, "prompt_index": [0, 1, 2, 3], "reward": [0, 0, 0, 1]}) + "\n"
            + json.dumps({"step": 10, "prompt_index": [0, 1, 2, 3], "reward": rewards}) + "\n")
    per_prompt_line(tmp_path, SimpleNamespace(name="study"), "pacs", "grpo")
    # per prompt over the 2 seeds: pacs (1, 0.5, 0, 0), grpo (0.5, 0, 0, 0) -> Δ (0.5, 0.5, 0, 0), mean +0.250
    out = capsys.readouterr().out
    assert "pooled over 2 seeds (4 prompts; beside the registered test): Δ +0.250" in out


def test_no_noise_is_a_verdict_only_when_no_answer_was_right_and_the_bound_is_below_what_matters():
    zeros = [(0.0, 0.0, 200, 200)] * 5
    assert none_right_word(zeros, 0.05).startswith("not reproduced")  # 0 of 200: below 0.0149 < 0.05
    assert none_right_word([(0.0, 0.0, 50, 50)] * 5, 0.05).startswith("inconclusive")  # 0 of 50: below 0.058 only
    assert none_right_word([(0.5, 0.5, 200, 200)] * 5, 0.05).startswith("inconclusive")  # equal, not empty


def test_words_are_marked_interim_until_every_arm_has_every_registered_seed(tmp_path):
    from types import SimpleNamespace

    study = SimpleNamespace(name="study", seeds=3, arms=(SimpleNamespace(name="rloo"), SimpleNamespace(name="prime")))
    done = {"stopped_early": False}
    for arm, seed, summary in (("rloo", 0, done), ("rloo", 1, done), ("rloo", 2, done), ("prime", 0, done),
                               ("prime", 1, {"stopped_early": True}), ("prime", 3, done)):  # seed 1 stopped
        run = tmp_path / "study" / f"{arm}-s{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps(summary))
    line = interim(tmp_path, study)
    # prime: seed 1 stopped early, seed 2 never ran; seed 3 is not a registered seed and does not count
    assert line.startswith("INTERIM, no verdict: the registration names seeds 0-2") and "prime [1, 2]." in line
    assert "rloo" not in line
    for seed in (1, 2):
        (tmp_path / "study" / f"prime-s{seed}").mkdir(exist_ok=True)
        (tmp_path / "study" / f"prime-s{seed}" / "summary.json").write_text(json.dumps(done))
    assert interim(tmp_path, study) is None
