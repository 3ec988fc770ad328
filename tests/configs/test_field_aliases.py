"""Keys as veRL and TRL users write them: read as ours where they mean the same (with a notice), refused
with our key and what differs where they do not; keys of an algorithm that is not running are refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import algos
from configs import aliases
from configs.algo_sections import SECTIONS
from configs.loading import ConfigError, _known_keys, apply_flags, dump_annotated, resolve
from configs.schema import RunConfig
from launch.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _error(algo: str, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        resolve(algo, overrides=overrides)
    return str(e.value)


def test_every_entry_maps_to_a_key_of_ours_and_shadows_none():
    ours = set(_known_keys(RunConfig))
    assert not set(aliases.ALIASES) & ours  # an alias never hides one of our keys
    targets = {a.ours for a in aliases.ALIASES.values() if a.ours is not None}
    assert targets <= ours, f"aliases point at keys that do not exist: {sorted(targets - ours)}"
    assert all(a.note for a in aliases.ALIASES.values() if not a.same)  # a related key always says what differs


def test_same_meaning_keys_are_read_as_ours_with_a_notice(capsys):
    cfg = resolve("grpo", overrides=["data.train_batch_size=16", "actor_rollout_ref.actor.optim.lr=2e-6",
                                     "actor_rollout_ref.rollout.n=4", "num_iterations=2",
                                     "actor_rollout_ref.actor.clip_ratio_high=0.28"])
    assert (cfg.learner.batch_prompts, cfg.learner.lr, cfg.rollout.n) == (16, 2e-6, 4)
    assert (cfg.learner.epochs, cfg.loss.clip_high) == (2, 0.28)
    err = capsys.readouterr().err
    assert "[config] data.train_batch_size is veRL's name: read as learner.batch_prompts\n" in err
    assert "[config] num_iterations is TRL's name: read as learner.epochs\n" in err
    assert err.count("[config]") == 5  # one line per key, said once


def test_a_verl_and_a_trl_config_file_port(tmp_path, capsys):
    verl = tmp_path / "verl.yaml"
    verl.write_text(yaml.safe_dump({
        "algo": "grpo",
        "data": {"train_batch_size": 32, "max_response_length": 200, "max_prompt_length": 200},
        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}, "ppo_epochs": 2, "kl_loss_coef": 0.001},
                              "rollout": {"n": 4, "temperature": 0.7}},
        "trainer": {"total_training_steps": 20, "save_freq": 5},
    }))
    cfg = resolve(config_file=str(verl))
    assert (cfg.learner.batch_prompts, cfg.rollout.max_response_tokens, cfg.data.max_prompt_tokens) == (32, 200, 200)
    assert (cfg.learner.lr, cfg.learner.epochs, cfg.loss.kl_coef) == (1e-6, 2, 0.001)
    assert (cfg.rollout.n, cfg.rollout.temperature, cfg.learner.steps, cfg.learner.save_every) == (4, 0.7, 20, 5)
    assert cfg.learner.micro_batch_samples == 32  # grpo.yaml's, untouched: the file only laid these keys over it
    assert "veRL's kl_loss_type defaults to low_var_kl, loss.kl_estimator here to k1" in capsys.readouterr().err

    trl = tmp_path / "trl.yaml"
    trl.write_text("algo: grpo\nlearning_rate: 1.0e-6\nnum_generations: 4\nmax_completion_length: 200\n"
                   "warmup_steps: 5\n")
    cfg = resolve(config_file=str(trl))
    assert (cfg.learner.lr, cfg.rollout.n, cfg.rollout.max_response_tokens, cfg.learner.warmup_steps) == \
        (1e-6, 4, 200, 5)
    # TRL's warmup_steps is the user's learner.warmup_steps: a run of 2 learner steps × 1 × 1 = 2 optimiser
    # steps refuses a warm-up of 5 rather than shortening it as it does grpo.yaml's default of 10
    with pytest.raises(ConfigError, match="learner.warmup_steps: 5 optimiser steps of LR warm-up exceed"):
        resolve(config_file=str(trl), flags={"learner.steps": 2})


def test_an_alias_and_our_key_with_two_values_are_refused(tmp_path):
    f = tmp_path / "both.yaml"
    f.write_text("algo: grpo\nlearning_rate: 1.0e-6\nlearner:\n  lr: 1.0e-5\n")
    with pytest.raises(ConfigError, match=f"learning_rate: TRL's name of learner.lr, which {f} also sets to "
                                          "another value — keep one of the two"):
        resolve(config_file=str(f))


@pytest.mark.parametrize("override,message", [
    ("beta=0.04", "beta: unknown key — did you mean 'loss.kl_coef'? TRL's beta is the KL coefficient, with the k3 "
                  "estimator (loss.kl_estimator=low_var_kl here, clamped); pacs.beta and prime.beta are other"),
    ("max_steps=100", "max_steps: unknown key — did you mean 'learner.steps'? TRL's max_steps counts optimiser steps; "
                      "learner.steps counts learner steps, each learner.mini_batches × learner.epochs optimiser"),
    ("per_device_train_batch_size=8", "did you mean 'learner.batch_prompts'? TRL's per_device_train_batch_size "
                                      "counts samples per device; learner.batch_prompts counts prompts"),
    ("max_prompt_length=512", "did you mean 'data.max_prompt_tokens'? TRL's max_prompt_length cuts a longer prompt "
                              "from the left; here a longer prompt is skipped, never cut"),
    ("epsilon=0.2", "did you mean 'loss.clip_low'? TRL's epsilon is the lower clip bound, and the upper one too"),
    ("algorithm.kl_ctrl.kl_coef=0.001", "did you mean 'loss.kl_coef'? veRL's algorithm.kl_ctrl.kl_coef weighs a KL "
                                        "penalty in the reward"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps=10", "did you mean 'learner.warmup_steps'? veRL's "
     "actor_rollout_ref.actor.optim.lr_warmup_steps counts training steps"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=64", "did you mean 'learner.mini_batches'? veRL's "
     "actor_rollout_ref.actor.ppo_mini_batch_size counts prompts per optimiser step"),
])
def test_related_keys_are_refused_naming_ours_and_what_differs(override, message):
    assert message in _error("grpo", [override])


def test_the_reviews_misleading_suggestions_now_point_right(capsys):
    """Before: data.train_batch_size → 'data.train_prompts' (the synthetic set's size), learning_rate →
    'learner.mini_batches', beta → 'pacs.beta'."""
    cfg = resolve("grpo", overrides=["data.train_batch_size=16", "learning_rate=3e-6"])
    assert (cfg.learner.batch_prompts, cfg.learner.lr, cfg.data.train_prompts) == (16, 3e-6, 10000)
    assert "did you mean 'loss.kl_coef'?" in _error("grpo", ["beta=0.04"])
    assert "pacs.beta'?" not in _error("grpo", ["beta=0.04"])
    # near misses of the names: by the name's tail, before the closest key of ours
    assert "train_batch_size: unknown key — did you mean 'learner.batch_prompts'? (veRL's data.train_batch_size)" \
        in _error("grpo", ["train_batch_size=16"])
    assert "learner.learning_rate: unknown key — did you mean 'learner.lr'? (TRL's learning_rate)" \
        in _error("grpo", ["learner.learning_rate=1e-6"])
    assert "loss.entropy_coeff: unknown key — did you mean 'loss.entropy_coef'?" \
        in _error("grpo", ["loss.entropy_coeff=0.001"])


def test_suggestions_stay_in_the_running_algorithms_sections():
    assert "did you mean 'pure.credit'" in _error("pure", ["credit=strict"])
    assert "pure.credit" not in _error("grpo", ["credit=strict"])


def test_an_unknown_section_names_each_key_in_it():
    err = _error("grpo", ["actor_rollout_ref.actor.fsdp_config.param_offload=true"])
    assert "actor_rollout_ref.actor.fsdp_config.param_offload: unknown key" in err


def test_a_key_of_another_algorithm_is_refused_in_one_line(capsys, tmp_path):
    assert main(["--algo", "grpo", "--set", "pacs.beta=2", "--dry-run"]) == 2
    assert capsys.readouterr().err == ("algo-train: pacs.beta: belongs to --algo pacs, and this run is --algo grpo "
                                       "— drop it, or run --algo pacs\n")
    f = tmp_path / "c.yaml"
    f.write_text("algo: grpo\npure:\n  credit: strict\n")
    with pytest.raises(ConfigError, match="^pure.credit: belongs to --algo pure, and this run is --algo grpo"):
        resolve(config_file=str(f))
    with pytest.raises(ConfigError, match="^grpo.use_std: belongs to --algo grpo, and this run is --algo rloo"):
        resolve("rloo", overrides=["algorithm.norm_adv_by_std_in_grpo=false"])  # veRL's name of grpo.use_std
    assert resolve("pacs", overrides=["pacs.beta=2"]).pacs.beta == 2
    # --resume applies its --set keys with apply_flags to the saved run's config
    with pytest.raises(ConfigError, match="^prime.beta: belongs to --algo prime, and this run is --algo grpo"):
        apply_flags(resolve("grpo").model_dump(mode="json"), {}, ["prime.beta=0.1"])


@pytest.mark.parametrize("name", algos.names())
def test_presets_resolve_and_refuse_the_other_algorithms_keys(name, tmp_path):
    cfg = resolve(name)
    saved = tmp_path / "config.yaml"  # a run folder's config.yaml, reused as --config
    saved.write_text(dump_annotated(cfg))
    assert resolve(config_file=str(saved)) == cfg
    for other, section in SECTIONS.items():
        if other != name:
            key = f"{other}.{next(iter(section.model_fields))}"
            with pytest.raises(ConfigError, match=f"^{key}: belongs to --algo {other}, and this run is --algo {name}"):
                resolve(name, overrides=[f"{key}=1"])  # refused before any value is checked


def test_aliases_load_without_torch():
    code = ("import sys; from configs.loading import resolve\n"
            "cfg = resolve('grpo', overrides=['learning_rate=1e-6', 'actor_rollout_ref.rollout.n=4'])\n"
            "assert (cfg.learner.lr, cfg.rollout.n) == (1e-6, 4)\n"
            "print(sorted(m for m in ('torch', 'vllm', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"resolving aliases loaded {out.stdout.strip()}"


def test_the_docs_table_marks_every_entry_as_the_table_does():
    """docs/running.md "Coming from veRL or TRL": each veRL/TRL name (or its dotted tail) marked ✓ (read
    as ours) or ✗ (refused with a hint), as configs/aliases.py has it."""
    doc = (ROOT / "docs" / "running.md").read_text().split("## Coming from veRL or TRL")[1].split("\n## ")[0]
    marked = re.findall(r"`([^`]+)` ([✓✗])", doc)
    for a in aliases.ALIASES.values():
        marks = ({m for name, m in marked if a.name == name}
                 or {m for name, m in marked if a.name.endswith("." + name)})  # `optim.betas`: a tail
        assert marks == {"✓" if a.same else "✗"}, f"{a.name}: the docs mark it {marks or 'nowhere'}"
    for name, _ in marked:
        assert any(a.name == name or a.name.endswith("." + name) for a in aliases.ALIASES.values()), name
