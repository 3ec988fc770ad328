"""PURE steps: step splitting, min-form transform of PRM step scores, and process-reward credit assignment.

ALGORITHMS.md "PURE"; REFERENCE_NOTES §3.1–3.3, §3.5, §7.7–7.8. Shapes: B rows, T padded response
width, `mask` [B, T] response mask, `step_end` [B, T] bool (True on the last token of every step),
`step_scores` [B, T] float (the step's PRM score p_k ∈ [−1, 1] at its step-end token, 0 elsewhere).
Functions taking a `step_mask` work on any layout whose last dim indexes steps or tokens: [B, K] step
lists (as the reference vectors) or [B, T] with `step_mask = step_end`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from algos.pure.options import CREDITS
from algos.returns import discounted_returns, suffix_sum

SEPARATOR = "\n\n"


def step_spans(texts: Sequence[str], separator: str = SEPARATOR) -> list[tuple[int, int]]:
    """Token spans [start, end) of the steps of one response given its per-token decoded texts.

    A step ends at the token where the step's decoded text (the concatenation of its tokens' texts
    since the previous step end) first ends with `separator`; the last token always ends a step.
    So "\\n\\n" split over two tokens ("\\n", "\\n") ends the step at the second, a ".\\n\\n" token ends
    it at that token, and a final separator token ends one step only (never a duplicate).
    An empty response has no steps.

    Deviations from the reference: the reference marks only tokens whose own text ends with "\\n\\n"
    (so with a character tokenizer it finds no step); here the step's accumulated text is tested.
    A separator that is also the final token is one step end (the reference lists it twice and PURE-main
    then fails on a shape mismatch).
    """
    if not separator:
        raise ValueError("the step separator must be non-empty")
    spans: list[tuple[int, int]] = []
    start, tail, k = 0, "", len(separator)
    for t, tok in enumerate(texts):
        tail = (tail + tok)[-k:]
        if tail.endswith(separator):
            spans.append((start, t + 1))
            start, tail = t + 1, ""
    if start < len(texts):
        spans.append((start, len(texts)))
    return spans


def turn_spans(env: Sequence[bool]) -> list[tuple[int, int]]:
    """Token spans [start, end) of the steps of one multi-turn response: one step per policy turn (`env:` runs).

    `env[t]` is True on environment tokens (tool results, observations, the template's turn markers between
    turns: `Sample.env_mask`). A policy turn is a maximal run of policy tokens; its step ends on the turn's last
    token and starts right after the previous step's end, so a step holds the observation the turn answers
    followed by the turn: the PRM reads each turn in the context of the tool output before it, and the score lands
    on a policy token (environment tokens are outside the response mask, `algos.pure.maths.check_step_ends`).
    Environment tokens after the last policy turn belong to no step; a response without policy tokens has none.
    E.g. env [0 0 1 1 1 0 0] -> [(0, 2), (2, 7)]: turn 1 ends at token 1, turn 2 (after the observation 2..4) at 6.

    Deviation from PURE's paper, which is single-turn: a turn, not a "\\n\\n"-separated paragraph, is the step,
    so the min-form is taken over turns (a separator inside a turn does not split it).
    """
    spans: list[tuple[int, int]] = []
    start, n = 0, len(env)
    for t in range(n):
        if not env[t] and (t + 1 == n or env[t + 1]):
            spans.append((start, t + 1))
            start = t + 1
    return spans


def split_steps(token_texts: Sequence[Sequence[str]], width: int | None = None,
                separator: str = SEPARATOR) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ends of a batch from per-token decoded strings (`token_texts[i]` = row i's response tokens).

    Returns (step_end [B, W] bool, step_index [B, W] int64): step_end is True on each step's last token
    (rule in `step_spans`); step_index is the 0-based step of each response token and −1 on padding.
    W = `width` or the longest row; a row longer than `width` is a ValueError.
    """
    lengths = [len(row) for row in token_texts]
    w = max(lengths, default=0) if width is None else width
    if lengths and max(lengths) > w:
        raise ValueError(f"a row has {max(lengths)} tokens, more than the width {w}")
    step_end = torch.zeros(len(token_texts), w, dtype=torch.bool)
    step_index = torch.full((len(token_texts), w), -1, dtype=torch.int64)
    for i, row in enumerate(token_texts):
        for k, (a, b) in enumerate(step_spans(row, separator)):
            step_end[i, b - 1] = True
            step_index[i, a:b] = k
    return step_end, step_index


def scores_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """PRM step score p = softmax(logits)[..., 1] − softmax(logits)[..., 0] ∈ [−1, 1]: [..., 2] -> [...]."""
    if logits.shape[-1] != 2:
        raise ValueError(f"PRM logits must have 2 classes in the last dim, got {logits.shape[-1]}")
    probs = torch.softmax(logits.float(), dim=-1)
    return probs[..., 1] - probs[..., 0]


def minform_weights(p: torch.Tensor, step_mask: torch.Tensor, temperature: float = 0.1,
                    uniform: bool = False) -> torch.Tensor:
    """Weights w [B, S] over each row's valid steps: softmax_k(−p_k/T), or 1/K (`uniform`); 0 elsewhere.

    A row with no valid step gets all-zero weights (not NaN). T must be > 0.
    """
    valid = step_mask.bool()
    if uniform:
        k = valid.sum(-1, keepdim=True).clamp_min(1).to(p.dtype)
        return valid.to(p.dtype) / k
    if temperature <= 0:
        raise ValueError(f"min-form temperature must be > 0 (got {temperature})")
    z = (-p / temperature).masked_fill(~valid, float("-inf"))
    w = torch.softmax(z, dim=-1)
    return torch.where(valid, w, torch.zeros_like(w))


def minform_rewards(p: torch.Tensor, step_mask: torch.Tensor, temperature: float = 0.1,
                    uniform: bool = False) -> torch.Tensor:
    """Min-form step rewards r_k = w_k·p_k (w from `minform_weights`), 0 on invalid steps: [B, S].

    Σ_k r_k → min_k p_k as T → 0. The weights are computed once over the whole response (the
    reference's global weighting, REFERENCE_NOTES §3.3 / §7.7), so suffix sums of r at later steps
    are not suffix minima; `strict_min_returns` gives the exact suffix minimum.
    """
    valid = step_mask.bool()
    w = minform_weights(p, valid, temperature, uniform)
    return torch.where(valid, w * p, torch.zeros_like(p))


def strict_min_returns(step_scores: torch.Tensor, step_end: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Strict min-form return R_t = min_{k : e_k ≥ t} p_k (steps ending at or after t): [B, T].

    Tokens after the row's last step end, padding, and rows without steps get 0.

    Deviations from the reference: PURE-verl's `strict min-form` takes a running minimum over all
    columns including non-step tokens and padding (which hold 0), i.e. min(0, ·); that bug is not
    reproduced (REFERENCE_NOTES §7.8).
    """
    ends = step_end.bool() & mask.bool()
    inf = torch.full_like(step_scores, float("inf"))
    v = torch.where(ends, step_scores, inf)
    suffix_min = v.flip(-1).cummin(-1).values.flip(-1)
    ok = torch.isfinite(suffix_min) & mask.bool()
    return torch.where(ok, suffix_min, torch.zeros_like(suffix_min))


def process_returns(
    step_scores: torch.Tensor,
    step_end: torch.Tensor,
    mask: torch.Tensor,
    credit: str = "minform",
    temperature: float = 0.1,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Credit assignment of step scores to tokens: (step rewards [B, T], process returns [B, T]).

    minform  r_k = softmax_k(−p_k/T)·p_k at step ends; R_t = Σ_{s≥t} r_s (plain suffix sum).
    uniform  r_k = p_k/K; R_t = Σ_{s≥t} r_s.
    strict   r_k = p_k; R_t = min over the steps ending at or after t (`strict_min_returns`).
    gamma    r_k = p_k; R_t = Σ_{s≥t} γ^{s−t} r_s over response tokens (token-level discount, as the
             shared `discounted_returns`).
    Returns are 0 on padding. Deviations from the reference: PURE-verl's gamma-decay ignores γ.
    """
    if credit not in CREDITS:
        raise ValueError(f"unknown pure.credit {credit!r}; choose one of {CREDITS}")
    m = mask.to(step_scores.dtype)
    ends = step_end.bool() & mask.bool()
    if credit in ("minform", "uniform"):
        r = minform_rewards(step_scores, ends, temperature, uniform=credit == "uniform")
        return r, suffix_sum(r * m) * m
    r = torch.where(ends, step_scores, torch.zeros_like(step_scores))
    if credit == "strict":
        return r, strict_min_returns(step_scores, ends, m)
    return r, discounted_returns(r, m, gamma) * m
