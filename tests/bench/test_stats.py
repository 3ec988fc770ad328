"""bench/common/stats.py: Student's t, the per-prompt tests, power and the verdict words (golden values, the
arithmetic in the comments)."""

import json
import math

import pytest

from bench.common.stats import (
    betainc,
    detectable_effect,
    final_prompt_rewards,
    mcnemar_exact,
    none_right_upper,
    paired_accuracy_delta,
    paired_bootstrap,
    paired_scores,
    per_prompt_scores,
    t_quantile,
    t_test,
    t_two_sided_p,
    verdict,
)


@pytest.mark.parametrize("t, df, p", [
    # df = 2 has a closed form: p = 1 − |t|/√(t² + 2)
    (2.07, 2, 1 - 2.07 / math.sqrt(2.07**2 + 2)),  # 1 − 2.07/2.50697 = 0.1743 (prm-drift, fixed PRM step acc)
    (3.47, 2, 1 - 3.47 / math.sqrt(3.47**2 + 2)),  # 1 − 3.47/3.74712 = 0.0740 (prm-drift, PRIME dpo_acc)
    (4.302653, 2, 0.05),  # the 97.5 % point of t(2)
    (2.776445, 4, 0.05),  # the 97.5 % point of t(4): five seeds
    (1.0, 1, 0.5),  # df = 1 is Cauchy: 1 − (2/π)·atan(1) = 1 − 0.5
    (2.0, 10, 0.073388),  # tables: P(|T10| ≥ 2) = 0.0734
    (1.959964, math.inf, 0.05),  # the normal
])
def test_t_two_sided_p_golden(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-6)
    assert t_two_sided_p(-t, df) == pytest.approx(p, abs=2e-6)


def test_the_issue_values_and_the_incomplete_beta():
    assert round(t_two_sided_p(2.07, 2), 3) == 0.174 and round(t_two_sided_p(3.47, 2), 3) == 0.074
    assert round(t_two_sided_p(2.776, 4), 3) == 0.050
    # I_x(1, 1) = x; I_x(a, b) + I_{1−x}(b, a) = 1
    assert betainc(1, 1, 0.3) == pytest.approx(0.3)
    assert betainc(2.5, 0.5, 0.7) + betainc(0.5, 2.5, 0.3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two seeds"):
        t_two_sided_p(1.0, 0)


def test_quantiles_and_detectable_effect():
    # t tables: t(0.975; 2) = 4.3027, t(0.80; 2) = 1.0607, t(0.975; 4) = 2.7764, t(0.80; 4) = 0.9410
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-5)
    assert t_quantile(0.8, 2) == pytest.approx(1.060660, abs=1e-5)
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-5)
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-5)
    # 80 % power at level 0.05: (4.3027 + 1.0607)·SE = 5.3633·SE with 3 seeds; (2.7764 + 0.9410)·SE = 3.7174·SE with 5
    assert detectable_effect(0.026, 2) == pytest.approx(5.36331 * 0.026, abs=1e-5)  # 0.139
    assert detectable_effect(1.0, 4) == pytest.approx(3.71741, abs=1e-5)
    assert detectable_effect(1.0, math.inf) == pytest.approx(1.959964 + 0.841621, abs=1e-5)


def test_paired_accuracy_delta_golden():
    # three seeds: d = 0.05, −0.02, 0.01 → Δ = 0.04/3 = 0.01333
    # seeds: sd(d) = 0.035119 → / √3 = 0.020276
    # evaluation: mean of a(1−a)/200 + b(1−b)/200 = (0.0019875 + 0.001658 + 0.0019935)/3 = 0.00187967,
    #   / 3 seeds → √0.00062656 = 0.025031 → σ = max = 0.025031; Δ ≥ −2σ = −0.0501 → no worse
    # t = 0.013333/0.025031 = 0.53267, df = 2 → p = 1 − 0.53267/√(0.53267² + 2) = 1 − 0.35248 = 0.64752
    out = paired_accuracy_delta([(0.30, 0.25, 200, 200), (0.20, 0.22, 200, 200), (0.28, 0.27, 200, 200)])
    assert out["delta"] == pytest.approx(0.013333, abs=1e-6)
    assert out["sigma_seeds"] == pytest.approx(0.020276, abs=1e-6)
    assert out["sigma"] == pytest.approx(0.025031, abs=1e-6) and out["no_worse"]
    assert out["t"] == pytest.approx(0.53267, abs=1e-5) and out["df"] == 2
    assert out["p"] == pytest.approx(0.64752, abs=1e-5)
    # one seed, 0.10 vs 0.30: σ = √(0.1·0.9/200 + 0.3·0.7/200) = √0.0015 = 0.03873; −0.2 < −0.0775 → worse; no t
    one = paired_accuracy_delta([(0.10, 0.30, 200, 200)])
    assert one["sigma_seeds"] is None and one["sigma"] == pytest.approx(0.038730, abs=1e-6)
    assert not one["no_worse"] and one["p"] is None and one["df"] is None


def test_mcnemar_exact_golden():
    # 20 prompts: 8 only A answers, 2 only B, 5 both, 5 neither. Under no difference the 10 discordant prompts
    # are A's with probability 1/2: P(X ≤ 2) = (C(10,0) + C(10,1) + C(10,2))/2¹⁰ = (1 + 10 + 45)/1024 = 0.0546875,
    # two-sided p = 0.109375; Δ = (8 − 2)/20 = 0.3
    a = [1] * 8 + [0] * 2 + [1] * 5 + [0] * 5
    b = [0] * 8 + [1] * 2 + [1] * 5 + [0] * 5
    out = mcnemar_exact(a, b)
    assert (out["a_only"], out["b_only"], out["delta"]) == (8, 2, pytest.approx(0.3))
    assert out["p"] == pytest.approx(0.109375)
    # 10 to 0: 2 · 1/1024 = 0.001953; no discordant prompt: p = 1
    assert mcnemar_exact([1] * 10, [0] * 10)["p"] == pytest.approx(2 / 1024)
    assert mcnemar_exact([1, 0], [1, 0])["p"] == 1.0
    with pytest.raises(ValueError, match="paired_bootstrap"):
        mcnemar_exact([0.5], [1])


def test_none_right_upper_golden():
    # 0 of 200: (1 − p)^200 = 0.05 -> p = 1 − 0.05^(1/200) = 1 − e^(ln 0.05 / 200) = 1 − e^(−0.0149787) = 0.014867
    assert none_right_upper(200) == pytest.approx(0.014867039)
    assert none_right_upper(50) == pytest.approx(0.058155079)  # 0 of 50 cannot rule out 0.05
    assert none_right_upper(1) == pytest.approx(0.95)  # one failure says little
    with pytest.raises(ValueError):
        none_right_upper(0)


def test_paired_bootstrap():
    # every prompt A 1, B 0: every resample's Δ* = 1, none ≤ 0 → p = 2·(0 + 1)/(999 + 1) = 0.002, SE 0
    out = paired_bootstrap([1.0] * 20, [0.0] * 20, reps=999)
    assert out["delta"] == 1.0 and out["se"] == 0.0 and out["ci95"] == (1.0, 1.0)
    assert out["p"] == pytest.approx(0.002)
    # identical models: every Δ* = 0 counts on both sides → p = min(1, 2·1000/1000) = 1
    assert paired_bootstrap([0.5, 1.0, 0.0], [0.5, 1.0, 0.0], reps=999)["p"] == 1.0
    # one prompt in ten differs by +1: Δ = 0.1, the bootstrap SE ≈ √(0.1·0.9/10) = 0.095 (sd of a resampled mean)
    noisy = paired_bootstrap([1.0] + [0.0] * 9, [0.0] * 10, reps=4000, seed=1)
    assert noisy["delta"] == pytest.approx(0.1) and noisy["se"] == pytest.approx(0.0949, abs=0.006)
    assert noisy["p"] > 0.3  # a third of the resamples (0.9¹⁰ = 0.35) hold no differing prompt: Δ* = 0


def test_per_prompt_scores_from_algo_train_eval_json(tmp_path):
    # the layout launch/commands/evaluate.py writes: n samples a prompt, per_prompt {prompt_index, correct, ...}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"n": 4, "per_prompt": [{"prompt_index": 1, "correct": 3}, {"prompt_index": 0, "correct": 4}]}))
    b.write_text(json.dumps({"n": 4, "per_prompt": [{"prompt_index": 0, "correct": 2}, {"prompt_index": 1, "correct": 0}]}))
    assert paired_scores(per_prompt_scores(a), per_prompt_scores(b)) == ([1.0, 0.75], [0.5, 0.0])
    with pytest.raises(ValueError, match="same --data"):
        paired_scores({0: 1.0}, {1: 1.0})
    # a run's own evaluations: the last step's line is its final model
    (tmp_path / "eval_prompts.jsonl").write_text('{"step": 0, "prompt_index": [0, 1], "reward": [0.0, 0.0]}\n'
                                                 '{"step": 40, "prompt_index": [0, 1], "reward": [1.0, 0.0]}\n')
    assert final_prompt_rewards(tmp_path) == {0: 1.0, 1: 0.0}
    with pytest.raises(ValueError, match="algo-train eval"):
        final_prompt_rewards(tmp_path / "nowhere")
    (tmp_path / "old.json").write_text(json.dumps({"n": 1}))
    with pytest.raises(ValueError, match="per_prompt"):
        per_prompt_scores(tmp_path / "old.json")


def test_the_four_words():
    # +0.104 ± 0.030 with 3 seeds (prm-drift, PRIME dpo_acc): t = 3.47, p = 0.074 → right direction, not significant
    v = verdict(0.104, 0.030, 2, paper_sign=+1)
    assert v.word == "direction only" and v.test.p == pytest.approx(0.0740, abs=1e-4)
    # detectable at 80 %: 5.3633 · 0.030 = 0.161
    assert v.detectable == pytest.approx(0.16090, abs=1e-4)
    assert v.text() == "direction only (t = 3.47, df = 2, p = 0.074; detectable at 80% power: 0.161)"
    # significant in the paper's direction: 0.2 ± 0.03, t = 6.67 → p = 1 − 6.667/√46.44 = 0.0218
    assert verdict(0.2, 0.03, 2, +1).word == "reproduced"
    # significant against it
    assert verdict(-0.2, 0.03, 2, +1).word == "not reproduced"
    # a null result with power: −0.01 ± 0.01 over 5 seeds sees 3.7174·0.01 = 0.037 ≤ 0.05 that matters
    null = verdict(-0.01, 0.01, 4, +1, matters=0.05)
    assert null.word == "not reproduced" and null.detectable == pytest.approx(0.037174, abs=1e-5)
    # the same null with 3 seeds and SE 0.038 (pacs): sees 5.3633·0.038 = 0.204 > 0.05 → too little power
    assert verdict(-0.032, 0.038, 2, +1, matters=0.05).word == "inconclusive"
    # an unfair test is inconclusive whatever its p
    unfair = verdict(0.2, 0.03, 2, +1, unfair="GRPO's entropy did not collapse")
    assert unfair.word == "inconclusive" and "entropy" in unfair.text()
    with pytest.raises(ValueError, match="paper_sign"):
        verdict(0.1, 0.1, 2, 0)
    assert t_test(-0.06, 0.024, 2).text() == "t = -2.50, df = 2, p = 0.130"
