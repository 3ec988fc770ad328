"""`learner.lr_horizon_steps`: the LR schedule's horizon is its own key (a resumed run that trains longer
keeps the curve it started with, launch.state.rundir), not always `learner.steps`."""

from __future__ import annotations

import pytest

from learner.learner import Learner
from tests.learner.helpers import make_cfg, make_groups


def test_the_schedule_decays_over_the_horizon_not_the_steps(tiny_dir, tokenizer):
    """steps=10 with lr_horizon_steps=20, 1 optimiser step each, linear decay, no warm-up: optimiser step
    s (0-based) has lr 1e-3·(1 − s/20); at s = 5 that is 7.5e-4 (with the horizon 10 it would be 5e-4)."""
    cfg = make_cfg("grpo", learner={"steps": 10, "lr_horizon_steps": 20, "lr_schedule": "linear"})
    learner = Learner(cfg, 0, 1, tiny_dir)
    assert learner.total_optimizer_steps == 20
    learner.optimizer_steps = 5  # as after a resume at optimiser step 5
    assert learner.step(make_groups(tokenizer, 2, 4), version=5)["optim/lr"] == pytest.approx(7.5e-4)
    cfg.learner.lr_horizon_steps = None
    assert Learner(cfg, 0, 1, tiny_dir).total_optimizer_steps == 10  # null = learner.steps
