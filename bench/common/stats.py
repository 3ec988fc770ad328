"""The statistics a benchmark's verdict rests on, in the standard library only (no scipy in the project's venv).

- Means over seeds: `mean_se` (mean and standard error), `paired_accuracy_delta` (a setting against its
  baseline, paired by seed, with its t statistic, degrees of freedom and two-sided p-value).
- Student's t: `t_two_sided_p` (exact, through the regularized incomplete beta function `betainc`),
  `t_quantile` (its inverse, by bisection; df = inf is the normal), `t_test` (a mean ± SE over n seeds).
- Per-prompt tests of two final models on the same held-out prompts: a run's own evaluations
  (RUN_DIR/eval_prompts.jsonl, greedy: `final_prompt_rewards`) or `algo-train eval --json OUT` (`per_prompt`:
  {prompt_index, correct of n samples}; `per_prompt_scores`); `mcnemar_exact` on the prompts only one model
  answers (one sample a prompt), `paired_bootstrap` on per-prompt scores (any n). Pooled over seeds, the
  bootstrap takes each prompt's mean over the seeds' models (it then sees prompt noise, not seed noise).
- Power: `detectable_effect`, the smallest true effect a two-sided test at level alpha detects with
  probability `power`, (t_{1−α/2, df} + t_{power, df}) × SE (the usual normal-shift approximation).
- `verdict`: the four words of a study's result, used strictly (`Verdict`).

Tested with golden values in tests/bench/test_stats.py.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ALPHA = 0.05  # two-sided significance level of every verdict
POWER = 0.8  # the power the detectable effect is stated at


# ---------------------------------------------------------------------------------------------- means
def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) >= 2 else None)


def mean_se(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean) of the values that are not None; SE None below two values."""
    mean, sd = mean_sd(values)
    return mean, (sd / math.sqrt(sum(v is not None for v in values)) if sd is not None else None)


# ---------------------------------------------------------------------------------------------- Student's t
def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz), on the
    side of x where it converges fast (I_x(a, b) = 1 − I_{1−x}(b, a))."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    frac = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            frac *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * frac / a


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2); df = inf: normal."""
    if df <= 0:
        raise ValueError(f"t test: degrees of freedom must be positive, got {df} (two seeds at least)")
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2))
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The t value below which a share `q` of Student's t with `df` degrees of freedom lies (0 < q < 1)."""
    if not 0 < q < 1:
        raise ValueError(f"t_quantile: q must lie in (0, 1), got {q}")
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(q)
    if q < 0.5:
        return -t_quantile(1 - q, df)
    lo, hi = 0.0, 1.0
    while 1 - t_two_sided_p(hi, df) / 2 < q:  # the upper tail is half the two-sided p
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - t_two_sided_p(mid, df) / 2 < q else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class TTest:
    effect: float  # the mean (difference)
    se: float
    df: float
    t: float
    p: float  # two-sided

    def text(self) -> str:
        df = "∞" if math.isinf(self.df) else f"{self.df:g}"
        return f"t = {self.t:.2f}, df = {df}, p = {self.p:.3f}"


def t_test(effect: float, se: float, df: float) -> TTest:
    """Two-sided test of `effect` = 0 from its standard error (a mean over n seeds: df = n − 1)."""
    if se <= 0:
        raise ValueError(f"t test: the standard error must be positive, got {se}")
    t = effect / se
    return TTest(effect, se, df, t, t_two_sided_p(t, df))


def detectable_effect(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true effect a two-sided level-`alpha` test with this SE detects with probability `power`:
    (t_{1−α/2, df} + t_{power, df}) × SE."""
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se


def paired_accuracy_delta(pairs: Sequence[tuple[float, float, int, int]]) -> dict:
    """Mean accuracy difference of a setting against its baseline, paired by seed (same seed = same
    starting model and prompt order), and the noise it must be judged against.

    pairs: (acc, acc_baseline, eval_n, eval_n_baseline) per seed. Noise σ is the larger of
      - the seeds' standard error of the mean paired difference, sd(d)/√m (needs m ≥ 2 seeds), and
      - the evaluation's own binomial standard error of that mean, √(mean(a(1−a)/n + b(1−b)/n_b) / m)
        (it treats the two evaluations as independent; on the same prompts that overstates the noise).
    `t`, `df`, `p`: Δ/σ against Student's t with m − 1 degrees of freedom, two-sided (conservative when σ is the
    binomial term); None below two seeds. `no_worse` is Δ ≥ −2σ."""
    if not pairs:
        raise ValueError("paired_accuracy_delta: no pairs")
    d = [a - b for a, b, _, _ in pairs]
    m = len(d)
    se_eval = math.sqrt(statistics.fmean(a * (1 - a) / na + b * (1 - b) / nb for a, b, na, nb in pairs) / m)
    se_seeds = statistics.stdev(d) / math.sqrt(m) if m >= 2 else None
    sigma = max(se_eval, se_seeds or 0.0)
    delta = statistics.fmean(d)
    test = t_test(delta, sigma, m - 1) if m >= 2 and sigma > 0 else None
    return {"delta": delta, "sigma": sigma, "sigma_seeds": se_seeds, "sigma_eval": se_eval, "seeds": m,
            "t": test.t if test else None, "df": m - 1 if test else None, "p": test.p if test else None,
            "no_worse": delta >= -2 * sigma}


# ---------------------------------------------------------------------------------------------- per prompt
def final_prompt_rewards(run_dir: str | Path) -> dict[int, float]:
    """{prompt_index: reward} of a run's last evaluation (its final model), from RUN_DIR/eval_prompts.jsonl."""
    from launch.loop.metrics import read_eval_prompts

    if not (Path(run_dir) / "eval_prompts.jsonl").is_file():
        raise ValueError(f"{run_dir}: no eval_prompts.jsonl (runs before issue 43 saved accuracies only; evaluate "
                         "their hf/step_N with `algo-train eval --json OUT` and read it with per_prompt_scores)")
    per_step = read_eval_prompts(run_dir)
    return per_step[max(per_step)]


def per_prompt_scores(eval_json: str | Path) -> dict[int, float]:
    """{prompt_index: share of its samples correct} from `algo-train eval --json OUT`'s `per_prompt`."""
    out = json.loads(Path(eval_json).read_text())
    if "per_prompt" not in out:
        raise ValueError(f"{eval_json}: no per_prompt results (write it with `algo-train eval ... --json OUT`)")
    return {p["prompt_index"]: p["correct"] / out["n"] for p in out["per_prompt"]}


def paired_scores(a: dict[int, float], b: dict[int, float]) -> tuple[list[float], list[float]]:
    """The scores of the prompts both evaluations hold, in prompt order; refuses two different prompt sets."""
    if set(a) != set(b):
        raise ValueError(f"paired test: the evaluations hold different prompts ({len(set(a) ^ set(b))} in one only) "
                         "— evaluate both models on the same --data and --limit")
    keys = sorted(a)
    return [a[k] for k in keys], [b[k] for k in keys]


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> dict:
    """Exact McNemar test of two models' right/wrong answers (1/0, one sample a prompt) on the same prompts:
    only the discordant prompts count; under no difference each is A's with probability 1/2, so the two-sided
    p-value is min(1, 2 · P(X ≤ min(a_only, b_only))) for X ~ Binomial(a_only + b_only, 1/2)."""
    if len(a) != len(b):
        raise ValueError(f"mcnemar: {len(a)} and {len(b)} prompts; pair them first (paired_scores)")
    if any(v not in (0, 1, 0.0, 1.0) for v in (*a, *b)):
        raise ValueError("mcnemar: answers must be right (1) or wrong (0): one sample a prompt "
                         "(algo-train eval --n 1); use paired_bootstrap for shares of several samples")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    n = a_only + b_only
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1)) / 2**n
    return {"a_only": a_only, "b_only": b_only, "prompts": len(a), "delta": (a_only - b_only) / len(a),
            "p": min(1.0, 2 * tail)}


def none_right_upper(n: int, confidence: float = 0.95) -> float:
    """Exact one-sided upper bound (Clopper–Pearson) on a success rate when none of `n` independent trials
    succeeded: the rate p with (1 − p)^n = 1 − confidence, i.e. 1 − (1 − confidence)^(1/n), about 3/n at 95 %."""
    if n < 1:
        raise ValueError(f"none_right_upper: needs at least one trial, got {n}")
    return 1 - (1 - confidence) ** (1 / n)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], reps: int = 10_000, seed: int = 0) -> dict:
    """Paired bootstrap over prompts of Δ = mean(a − b): the prompts resampled with replacement `reps` times
    (random.Random(seed)). Two-sided p = min(1, 2 · (min(#Δ* ≤ 0, #Δ* ≥ 0) + 1) / (reps + 1)); 95 % interval
    from the 2.5 and 97.5 percentiles; `se` the bootstrap SD of Δ*."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired bootstrap: needs the same prompts on both sides, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    n, rng = len(d), random.Random(seed)
    stars = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    below, above = sum(s <= 0 for s in stars), sum(s >= 0 for s in stars)
    return {"delta": statistics.fmean(d), "prompts": n, "reps": reps, "se": statistics.pstdev(stars),
            "ci95": (stars[int(0.025 * (reps - 1))], stars[int(0.975 * (reps - 1))]),
            "p": min(1.0, 2 * (min(below, above) + 1) / (reps + 1))}


# ---------------------------------------------------------------------------------------------- verdicts
WORDS = ("reproduced", "direction only", "not reproduced", "inconclusive")


@dataclass(frozen=True)
class Verdict:
    """A study's verdict in one of four words (`WORDS`), used strictly:
    - reproduced: significant at `ALPHA` in the paper's direction, on a fair test (the paper's comparison, its
      preconditions present);
    - direction only: the paper's direction, not significant;
    - not reproduced: a fair test against the paper, either significant in the other direction or able to see
      the paper's effect (detectable at `POWER` ≤ the effect that matters) and finding none;
    - inconclusive: no fair test (a precondition absent, an arm not the paper's comparison: `unfair` says
      which) or too little power to see the effect that matters."""

    word: str
    test: TTest | None
    detectable: float | None  # smallest effect detectable at POWER with this SE
    reason: str

    def text(self) -> str:
        figures = [self.test.text()] if self.test else []
        if self.detectable is not None:
            figures.append(f"detectable at {POWER:.0%} power: {self.detectable:.3f}")
        return f"{self.word} ({'; '.join([*figures, self.reason] if self.reason else figures)})"


def verdict(effect: float, se: float, df: float, paper_sign: int, matters: float | None = None,
            unfair: str = "") -> Verdict:
    """The verdict (`Verdict`) of an `effect` ± `se` (df degrees of freedom) where the paper expects the sign
    `paper_sign` (+1 or −1). `matters`: the smallest effect worth finding (e.g. the paper's size scaled to this
    setting), needed to call a null result "not reproduced"; `unfair`: why the test is not the paper's (empty
    when it is)."""
    if paper_sign not in (1, -1):
        raise ValueError(f"verdict: paper_sign must be +1 or -1, got {paper_sign}")
    test = t_test(effect, se, df)
    detectable = detectable_effect(se, df)
    if unfair:
        return Verdict("inconclusive", test, detectable, unfair)
    if test.p < ALPHA:
        if effect * paper_sign > 0:
            return Verdict("reproduced", test, detectable, "")
        return Verdict("not reproduced", test, detectable, "significant against the paper's direction")
    if effect * paper_sign > 0:
        return Verdict("direction only", test, detectable, "")
    if matters is not None and detectable <= abs(matters):
        return Verdict("not reproduced", test, detectable, f"the test could see {abs(matters):.3f} and found none")
    return Verdict("inconclusive", test, detectable,
                   "too little power" + (f": {abs(matters):.3f} matters" if matters is not None else
                                         ": no effect size stated to judge a null result"))
