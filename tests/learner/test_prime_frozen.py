"""prime.prm_update=frozen: the implicit PRM's weights stop changing after prime.prm_frozen_after learner
steps while its q still reach the advantage."""

import math

import numpy as np
import pytest

from learner.learner import Learner
from tests.learner.helpers import make_cfg, make_groups


def _prm_weights(learner) -> dict:
    return {k: v.detach().double().cpu().numpy().copy()
            for k, v in learner.providers["prime_q"].model.named_parameters()}


def test_frozen_prm_keeps_its_weights_and_rewards_flow(tiny_dir, tokenizer):
    """Step 0 online (prm_frozen_after=1): the PRM moves and prm_version = 1. Steps 1-2 frozen: weights
    bit-identical, prm_version stays 1, prm_lr logged 0, while q (from the step-0-trained PRM against the
    frozen reference) is non-zero and prm_loss finite."""
    groups = make_groups(tokenizer, 4, 4, version=1)
    cfg = make_cfg("prime", learner={"batch_prompts": 4},
                   prime={"prm_update": "frozen", "prm_frozen_after": 1, "prm_lr": 1e-3})
    learner = Learner(cfg, 0, 1, tiny_dir)
    w0 = _prm_weights(learner)
    m0 = learner.step(groups, version=1)
    w1 = _prm_weights(learner)
    assert m0["prime/prm_version"] == 1.0
    assert max(float(np.abs(w1[k] - w0[k]).max()) for k in w0) > 1e-4
    for v in (2, 3):
        m = learner.step(groups, version=v)
        assert m["prime/prm_version"] == 1.0 and m["prime/prm_lr"] == 0.0
        assert math.isfinite(m["prime/prm_loss"]) and abs(m["prime/q_mean"]) > 0
    w3 = _prm_weights(learner)
    for k in w1:
        np.testing.assert_array_equal(w3[k], w1[k], err_msg=k)


def test_frozen_refuses_a_loss_it_never_takes():
    with pytest.raises(ValueError, match="prime.prm_loss=ce"):
        make_cfg("prime", prime={"prm_update": "frozen", "prm_loss": "dpo"})
