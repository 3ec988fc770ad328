"""How a PRM's verdicts on the rollouts it scores compare with the task's step checker and with the verifier.

PURE's "process_rewards" provider (`learner.prm.pure.ProcessRewards`) logs these every step. They are the
PRIME paper's drift measurement (§5.1, Figs. 5-6: a PRM's accuracy on the policy's own rollouts over
training) for a PRM held fixed while the policy moves; `prime/dpo_acc` is the same measurement for PRIME's
online implicit PRM (`bench/evidence/evidence.py --study steps-prm-drift` sets them side by side).

- `pure/prm_step_acc`: over the steps both judge (a PRM score, and a checker verdict of +1 or −1; the
  checker's 0 is a step without a claim), the share with p_k > 0 ⇔ the checker's +1: the rule of the
  testbed PRM's own report (`launch.prep.testbed_prm.step_accuracy`). Only where the checker can read the
  prompt (the built-in arithmetic task, `tasks.step_checker`) and the PRM is not that checker itself;
  absent otherwise.
- `pure/prm_step_acc_correct`, `pure/prm_step_acc_wrong`: the same agreement on the steps the checker calls right
  (+1: the share the PRM scores p_k > 0) and on those it calls wrong (−1: the share with p_k ≤ 0), each absent
  when the step had none. A pooled accuracy moves with the share of wrong steps alone (a PRM that calls every
  step right scores the share of right steps), so a drift is read per class.
- `pure/prm_pair_acc`: PRIME's `dpo_acc` (`algos.prime.prm.dpo_accuracy`) with the PRM's min-form verdict
  min_k p_k as each response's score (0 for a response without a scored step): over the pairs of one
  group whose outcomes differ, how often the PRM orders them as the verifier does (0.5 for a group whose
  outcomes are all equal; mean over groups). Over this rank's rows: a group split between ranks loses
  the pairs across them. `pure/prm_pair_acc_mixed`: the same over the groups whose outcomes differ only (the
  0.5 of the others left out; absent when the step has none).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from algos.prime.prm import dpo_accuracy


def checker_verdicts(items: Sequence[tuple[str, str, Sequence[tuple[int, int]]]]) -> list[list[float | None]] | None:
    """The step checker's verdicts of each (prompt, response, step spans) item, or None when a prompt is not
    one the checker can read."""
    from tasks.step_checker import score_steps

    try:
        return [score_steps(prompt, response, spans) for prompt, response, spans in items]
    except ValueError:
        return None


def step_agreement(prm: Sequence[Sequence[float | None]], checker: Sequence[Sequence[float | None]]) -> float | None:
    """Share of the steps both judge where (PRM p_k > 0) == (checker +1); None when no step is judged by both."""
    agree = judged = 0
    for ps, cs in zip(prm, checker, strict=True):
        for p, c in zip(ps, cs, strict=True):
            if p is not None and c in (1.0, -1.0):
                judged += 1
                agree += (p > 0) == (c > 0)
    return agree / judged if judged else None


def step_agreement_by_class(prm: Sequence[Sequence[float | None]], checker: Sequence[Sequence[float | None]],
                            ) -> tuple[float | None, float | None]:
    """(share of the checker's +1 steps with PRM p_k > 0, share of its −1 steps with p_k ≤ 0); None for a class
    without a step judged by both."""
    hit, seen = [0, 0], [0, 0]  # [right steps, wrong steps]
    for ps, cs in zip(prm, checker, strict=True):
        for p, c in zip(ps, cs, strict=True):
            if p is not None and c in (1.0, -1.0):
                k = 0 if c > 0 else 1
                seen[k] += 1
                hit[k] += (p > 0) == (c > 0)
    return tuple(h / n if n else None for h, n in zip(hit, seen))


def mixed_rows(outcomes: Sequence[float], groups: Sequence[int]) -> list[int]:
    """Positions of the rows whose group has at least two different outcomes."""
    seen: dict[int, set[float]] = {}
    for o, g in zip(outcomes, groups):
        seen.setdefault(g, set()).add(float(o))
    return [i for i, g in enumerate(groups) if len(seen[g]) > 1]


def pair_accuracy(prm: Sequence[Sequence[float | None]], outcomes: Sequence[float], groups: Sequence[int]) -> float:
    """PRIME's dpo_acc of the min-form verdicts (module doc)."""
    verdict = [min((p for p in ps if p is not None), default=0.0) for ps in prm]
    if not verdict:
        return 0.5
    _, group_index = torch.unique(torch.tensor(groups), return_inverse=True)
    scores = torch.tensor(verdict, dtype=torch.float64)[:, None]
    return float(dpo_accuracy(scores, torch.tensor(outcomes, dtype=torch.float64), torch.ones_like(scores),
                              group_index))


def prm_agreement(items, prm: Sequence[Sequence[float | None]], outcomes: Sequence[float], groups: Sequence[int],
                  against_checker: bool) -> dict[str, float]:
    """The module's metrics for one step's rows: `items` (prompt, response, step spans), the PRM's raw step
    scores, the verifier's outcomes and the rows' groups; `against_checker`: also compare with the checker."""
    out = {"pure/prm_pair_acc": pair_accuracy(prm, outcomes, groups)}
    mixed = mixed_rows(outcomes, groups)
    if mixed:
        out["pure/prm_pair_acc_mixed"] = pair_accuracy([prm[i] for i in mixed], [outcomes[i] for i in mixed],
                                                       [groups[i] for i in mixed])
    checker = checker_verdicts(items) if against_checker else None
    if checker is None:
        return out
    step = step_agreement(prm, checker)
    if step is not None:
        out["pure/prm_step_acc"] = step
    right, wrong = step_agreement_by_class(prm, checker)
    out |= {k: v for k, v in (("pure/prm_step_acc_correct", right), ("pure/prm_step_acc_wrong", wrong))
            if v is not None}
    return out
