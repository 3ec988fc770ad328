"""Each algorithm's options come from `algos/` (torch-free), one meaning per KL estimator name, and a
default LR warm-up that fits a short run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import algos
from algos.ppo import kl_penalty
from configs.loading import ConfigError, resolve
from configs.schema import RunConfig


def test_configs_validate_and_show_a_run_without_torch():
    code = ("import sys, configs\nassert 'torch' not in sys.modules\n"
            "from configs.loading import dump_annotated, resolve\n"
            "for name in ('grpo', 'prime', 'pure', 'luffy', 'pacs', 'sft', 'rloo'):\n"
            "    dump_annotated(resolve(name))\n"
            "assert 'torch' not in sys.modules, 'configs imported torch'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_algorithm_section_is_its_options_class():
    for name in algos.names():
        options = algos.get(name).options
        if options is None:
            assert name not in RunConfig.model_fields
            continue
        section = RunConfig.model_fields[name].annotation
        assert list(section.model_fields) == list(options.__dataclass_fields__)
        assert RunConfig.model_fields[name].description == f"--algo {name} options"


def test_k3_means_the_unclamped_estimator_and_low_var_kl_the_clamped_one():
    # d = log π − log π_ref = −3 and 0.5: k3 = exp(−d) − 1 + d = e³ − 4 = 16.0855369 and
    # exp(−0.5) − 0.5 = 0.1065307; low_var_kl clamps the first to 10.
    lp, ref = torch.tensor([-3.0, 0.5]), torch.tensor([0.0, 0.0])
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), torch.tensor([16.0855369, 0.1065307]))
    torch.testing.assert_close(kl_penalty(lp, ref, "low_var_kl"), torch.tensor([10.0, 0.1065307]))


def test_the_old_k3_of_the_loss_term_is_refused_naming_its_new_name():
    with pytest.raises(ConfigError, match="loss.kl_estimator.*did you mean 'low_var_kl'"):
        resolve("grpo", overrides=["loss.kl_estimator=k3"])
    assert resolve("grpo", overrides=["loss.kl_estimator=low_var_kl"]).loss.kl_estimator == "low_var_kl"
    assert resolve("grpo").loss.kl_estimator == "k1"
    assert resolve("pure", overrides=["pure.kl_estimator=k3"]).pure.kl_estimator == "k3"


def test_a_default_warmup_longer_than_the_run_is_shortened_once_with_a_notice(capsys):
    # grpo.yaml warms up over 10 optimiser steps; `--steps 3` runs 3 × 1 × 1 = 3
    cfg = resolve("grpo", flags={"learner.steps": 3})
    assert cfg.learner.warmup_steps == 3
    err = capsys.readouterr().err
    assert err.count("learner.warmup_steps: the default LR warm-up of 10 optimiser steps is longer than this "
                     "run (learner.steps=3 × mini_batches 1 × epochs 1 = 3); shortened to 3") == 1
    assert resolve("grpo", flags={"learner.steps": 5}, overrides=["learner.epochs=2"]).learner.warmup_steps == 10
    assert capsys.readouterr().err == ""  # 5 × 2 = 10: fits, nothing said
    with pytest.raises(ConfigError, match="learner.warmup_steps: 11 optimiser steps of LR warm-up exceed"):
        resolve("grpo", flags={"learner.steps": 3}, overrides=["learner.warmup_steps=11"])  # the user's own
