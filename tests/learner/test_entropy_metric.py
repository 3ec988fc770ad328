"""The `entropy` metric every learner step (issue 32): logged with loss.entropy_coef 0 (no entropy loss
term), from the training forward's own logits, and then the same number the entropy term reports when
its coefficient is set."""

import math

import pytest
import torch

from learner.learner import Learner
from tests.learner.helpers import make_cfg, make_groups


def test_entropy_is_logged_without_its_loss_term(tiny_dir, tokenizer):
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)  # loss.entropy_coef 0: no entropy term
    head = learner.policy.lm.get_output_embeddings().weight
    vocab = head.shape[0]
    assert vocab == len(tokenizer) == 103
    with torch.no_grad():
        head.zero_()  # zero logits: every position's distribution is uniform over the vocabulary
    m = learner.step(make_groups(tokenizer, 2, 4), version=0)
    assert "loss/entropy" not in m
    # uniform over V = 103 tokens: H = ln 103 = 4.634729 nats at every token, so their token-mean too
    assert m["entropy"] == pytest.approx(math.log(vocab), rel=1e-6) == pytest.approx(4.634729, rel=1e-6)


def test_the_metric_equals_the_entropy_terms_value(tiny_dir, tokenizer):
    """Same initial weights and batch: the metric with coefficient 0 equals what the term reports with one
    (both are π_θ's entropy at the step's forward, aggregated under loss.agg over the loss mask)."""
    groups = make_groups(tokenizer, 2, 4)
    metrics = {}
    for coef in (0.0, 0.01):
        cfg = make_cfg("grpo", loss={"entropy_coef": coef, "agg": "seq-mean-token-mean"})
        metrics[coef] = Learner(cfg, 0, 1, tiny_dir).step(groups, version=0)
    assert 0.0 < metrics[0.0]["entropy"] < math.log(103)  # random weights: not uniform
    assert metrics[0.0]["entropy"] == pytest.approx(metrics[0.01]["entropy"], rel=1e-6)
    assert metrics[0.01]["loss/entropy"] == metrics[0.01]["entropy"] and "loss/entropy" not in metrics[0.0]
