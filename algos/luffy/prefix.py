"""LUFFY: prefix ratios and the construction of demonstration-guided rows (REFERENCE_NOTES §4.2).

A group holds n rows of one prompt. The first k rows (k = `n_prefix`, or n when `n_prefix = -1`) are
guided by the teacher's demonstration: row j gets a prefix ratio ρ_j, its response starts with the
first floor(len(target + eos)·ρ_j) demonstration tokens (off-policy, `prefix_mask` True), and the actor
generates the continuation of prompt + prefix (on-policy). The remaining rows get ρ = 0 (pure
on-policy). Everything here is a pure function of its arguments; the randomness comes from an RNG the
caller passes (a `random.Random`, which reproduces the reference's `random.uniform` draws exactly, or
a `torch.Generator`).

Step convention: `step` is our 0-based optimiser step. The reference looks windows up with
`global_steps − 1` where `global_steps` is 1-based, i.e. the same number: reference step s ↔ ours s − 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from algos.luffy.options import PREFIX_STRATEGIES

NUM_WINDOWS = 10


def _uniform(rng: random.Random | torch.Generator, lo: float, hi: float) -> float:
    """lo + (hi − lo)·u, u ~ U[0, 1) (the formula of python's `random.uniform`)."""
    if isinstance(rng, torch.Generator):
        u = float(torch.rand((), generator=rng, dtype=torch.float64))
        return lo + (hi - lo) * u
    return rng.uniform(lo, hi)


def prefix_ratio_windows(strategy: str, prefix_steps: int, max_ratio: float
                         ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(step windows, ratio windows) of the windowed strategies, 10 windows each.

    Step window w = [w·S/10, (w+1)·S/10] (inclusive at both ends), S = prefix_steps.
    reverse_linear: ratio window w = [0, (w+1)·max/10] (ratios grow over training);
    linear_max:     ratio window w = [0, (10−w)·max/10] (ratios shrink).
    Floats are computed with the reference's expressions so the tables match it bit for bit.

    Deviations from the reference: none (the rollout class's fallback prefix_steps = 300 is not
    reproduced: the caller passes `prefix_steps`).
    """
    if prefix_steps <= 0:
        raise ValueError(f"prefix_steps must be > 0, got {prefix_steps}")
    steps = [(w * prefix_steps / NUM_WINDOWS, (w + 1) * prefix_steps / NUM_WINDOWS) for w in range(NUM_WINDOWS)]
    if strategy == "reverse_linear":
        ratios = [(0, (w + 1) * max_ratio / NUM_WINDOWS) for w in range(NUM_WINDOWS)]
    elif strategy == "linear_max":
        ratios = [(0, (NUM_WINDOWS - w) * max_ratio / NUM_WINDOWS) for w in range(NUM_WINDOWS)]
    else:
        raise ValueError(f"prefix_ratio_windows: strategy {strategy!r} has no windows "
                         "(only reverse_linear and linear_max)")
    return steps, ratios


def window_index(step: int, step_windows: Sequence[tuple[float, float]]) -> int:
    """Index of the first window [a, b] with a ≤ step ≤ b; past the last window, the last one.

    Deviations from the reference: none (`step` is our 0-based step = the reference's global_steps − 1).
    """
    for w, (a, b) in enumerate(step_windows):
        if a <= step <= b:
            return w
    return len(step_windows) - 1


def prefix_ratios(
    strategy: str,
    n: int,
    n_prefix: int,
    step: int,
    rng: random.Random | torch.Generator,
    *,
    min_ratio: float = 1.0,
    max_ratio: float = 1.0,
    prefix_steps: int = 1000,
    linear_max_ratio: float = 0.8,
    share_across_samples: bool = False,
) -> list[float]:
    """Prefix ratios ρ for the n rows of one group (one prompt): a list of n floats in [0, 1].

    Rows 0..k−1 (k = n_prefix, or n when n_prefix = −1) get a ratio; rows k..n−1 get 0.0.
      random          ρ ~ U(min_ratio, max_ratio), one draw per row (one per group when shared)
      fixed           ρ_i = min + i·(max − min)/(k − 1), i = 0..k−1 (deterministic)
      linear          ρ = linear_max_ratio·(1 − min(step/prefix_steps, 1)) (deterministic)
      reverse_linear  ρ ~ U(0, (w+1)·linear_max_ratio/10), w = window of `step` (ratios grow)
      linear_max      ρ ~ U(0, (10−w)·linear_max_ratio/10) (ratios shrink)
    Draws are taken from `rng` in row order, so a batch of prompts processed in order with one
    `random.Random(seed)` reproduces the reference's sequence of `random.uniform` calls.

    Deviations from the reference:
      - fixed with k = 1 divides by zero there; here it gives [min_ratio] (numpy.linspace convention).
      - linear is reference-only with `prefix_share_across_samples`; it is deterministic, so here it
        is accepted either way (every guided row gets the same ρ).
      - invalid settings (n_prefix > n, n_prefix < −1, ratios outside [0, 1], min > max) raise
        ValueError instead of producing out-of-range prefixes.
    """
    if strategy not in PREFIX_STRATEGIES:
        raise ValueError(f"unknown prefix_strategy {strategy!r}; choose one of {PREFIX_STRATEGIES}")
    if n < 1:
        raise ValueError(f"group size n must be >= 1, got {n}")
    if n_prefix < -1 or n_prefix > n:
        raise ValueError(f"n_prefix must be in [-1, n={n}], got {n_prefix}")
    if not (0.0 <= min_ratio <= max_ratio <= 1.0):
        raise ValueError(f"need 0 <= min_prefix_ratio <= max_prefix_ratio <= 1, got {min_ratio}, {max_ratio}")
    if not (0.0 <= linear_max_ratio <= 1.0):
        raise ValueError(f"prefix_linear_max_ratio must be in [0, 1], got {linear_max_ratio}")
    k = n if n_prefix == -1 else n_prefix
    if k == 0:
        return [0.0] * n

    if strategy == "fixed":
        guided = [min_ratio] if k == 1 else [min_ratio + i * (max_ratio - min_ratio) / (k - 1) for i in range(k)]
    elif strategy == "linear":
        if prefix_steps <= 0:
            raise ValueError(f"prefix_steps must be > 0, got {prefix_steps}")
        guided = [linear_max_ratio * (1 - min(step / prefix_steps, 1))] * k
    else:
        if strategy == "random":
            lo, hi = min_ratio, max_ratio
        else:
            steps, windows = prefix_ratio_windows(strategy, prefix_steps, linear_max_ratio)
            lo, hi = windows[window_index(step, steps)]
        if share_across_samples:
            guided = [_uniform(rng, lo, hi)] * k
        else:
            guided = [_uniform(rng, lo, hi) for _ in range(k)]
    return list(guided) + [0.0] * (n - k)


def prefix_ratios_from_cfg(luffy_cfg: Any, n: int, step: int, rng: random.Random | torch.Generator) -> list[float]:
    """`prefix_ratios` with the options of `cfg.luffy` (n_prefix, prefix_strategy, min/max_prefix_ratio,
    prefix_steps, prefix_linear_max_ratio, prefix_share_across_samples). Deviations: see `prefix_ratios`."""
    c = luffy_cfg
    return prefix_ratios(c.prefix_strategy, n, c.n_prefix, step, rng,
                         min_ratio=c.min_prefix_ratio, max_ratio=c.max_prefix_ratio,
                         prefix_steps=c.prefix_steps, linear_max_ratio=c.prefix_linear_max_ratio,
                         share_across_samples=c.prefix_share_across_samples)


def demonstration_with_eos(target_ids: Sequence[int], eos_id: int) -> list[int]:
    """The demonstration as the reference trains on it: target + [eos] (an empty target stays empty).

    Deviations from the reference: none (the target is passed unpadded; see `strip_padding`).
    """
    target = [int(t) for t in target_ids]
    return target + [int(eos_id)] if target else []


def prefix_length(demo_len: int, ratio: float) -> int:
    """floor(demo_len·ρ), demo_len = len(target + eos).

    Deviations from the reference: ρ outside [0, 1] (or NaN) raises ValueError instead of slicing.
    """
    if not (0.0 <= ratio <= 1.0) or math.isnan(ratio):
        raise ValueError(f"prefix ratio must be in [0, 1], got {ratio}")
    return int(math.floor(demo_len * ratio))


def strip_padding(ids: Sequence[int] | torch.Tensor, pad_id: int, left: bool) -> list[int]:
    """Remove left padding (prompts) or right padding (targets) of one row [L] of token ids -> list.

    Deviations from the reference: none (a pad id equal to a real token id at the padded end is
    ambiguous there too).
    """
    seq = [int(t) for t in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    if left:
        i = 0
        while i < len(seq) and seq[i] == pad_id:
            i += 1
        return seq[i:]
    j = len(seq)
    while j > 0 and seq[j - 1] == pad_id:
        j -= 1
    return seq[:j]


def guided_prompt(prompt_ids: Sequence[int], target_ids: Sequence[int], eos_id: int, ratio: float
                  ) -> tuple[list[int], list[int]]:
    """(engine prompt, prefix): prefix = first floor(len(target+eos)·ρ) tokens of target + eos, and the
    generator is prompted with prompt + prefix. Inputs are unpadded id lists (see `strip_padding`).
    ρ = 0 gives the plain prompt and an empty prefix; ρ = 1 puts the whole demonstration (with its eos)
    in the prompt, so whatever the generator adds lies after the first eos and is masked out
    (ALGORITHMS.md: with ρ = 1 an actor may skip generation and pass an empty continuation).
    Deviations from the reference: none.
    """
    demo = demonstration_with_eos(target_ids, eos_id)
    prefix = demo[:prefix_length(len(demo), ratio)]
    return [int(t) for t in prompt_ids] + prefix, prefix
