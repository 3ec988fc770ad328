"""LUFFY on the actor side: which rows of a group are demonstration-guided, and their engine prompts.

Why here and not in the buffer: only the actor can generate the on-policy continuation of
prompt + demonstration prefix. The ratios come from `algos.luffy.prefix` (REFERENCE_NOTES §4.2), so
actor and reference agree on strategies and prefix lengths:
  - rho = 0: an ordinary on-policy row (all rows with rho 0 share one request with n = their count);
  - rho = 1: the whole demonstration (+eos) is the row and nothing is generated; the actor only
    counts it (`Group.meta["demo_rows"]`) and the buffer attaches the demonstration row itself;
  - 0 < rho < 1: the engine is prompted with prompt + the first floor(len(demo+eos)·rho) demonstration
    tokens, and the row is prefix (off-policy) + generated continuation (on-policy), cut to the
    response budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from algos.luffy.prefix import guided_prompt, prefix_ratios_from_cfg


@dataclass
class GroupPlan:
    """How the n rows of one group are produced."""

    on_policy: int  # rows generated from the plain prompt (rho = 0)
    demo_rows: int  # rows with rho = 1, attached by the buffer
    guided: list[float] = field(default_factory=list)  # ratios of the 0 < rho < 1 rows
    ratios: list[float] = field(default_factory=list)  # all n ratios, in the order the strategy gave them


def plan_group(luffy_cfg, n: int, step: int, rng) -> GroupPlan:
    """Prefix ratios for one group (`algos.luffy.prefix.prefix_ratios_from_cfg`) split into kinds."""
    ratios = prefix_ratios_from_cfg(luffy_cfg, n, step, rng)
    guided = [r for r in ratios if 0.0 < r < 1.0]
    return GroupPlan(on_policy=sum(r == 0.0 for r in ratios), demo_rows=sum(r >= 1.0 for r in ratios),
                     guided=guided, ratios=list(ratios))


def plain_group_plan(n: int) -> GroupPlan:
    return GroupPlan(on_policy=n, demo_rows=0, ratios=[0.0] * n)


def strip_eos(demo_ids, eos_id: int) -> list[int]:
    """The demonstration's target without a trailing eos (the buffer may store it with or without);
    `guided_prompt` appends exactly one."""
    ids = [int(t) for t in demo_ids]
    while ids and ids[-1] == eos_id:
        ids.pop()
    return ids


def guided_request(prompt_ids, demo_ids, eos_id: int, ratio: float) -> tuple[list[int], list[int]]:
    """(engine prompt ids, prefix ids) of a guided row with ratio `ratio` (0 < ratio < 1)."""
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"guided rows need 0 < ratio < 1, got {ratio}")
    return guided_prompt(list(prompt_ids), strip_eos(demo_ids, eos_id), eos_id, ratio)
