"""The step-by-step testbed at tiny sizes (`launch.prep.testbed`, `launch.prep.testbed_prm`,
`launch.prep.policy_samples`): the warm-up's accuracy stop and report, the PRM's labels, training, saving and
loading through `pure.prm=hf`, and the `--testbed` command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from actors.prompts import encode_prompt, load_tokenizer
from configs.loading import ConfigError, resolve
from launch.cli import main
from launch.prep.model_prep import prepare_model
from launch.prep.policy_samples import generate
from launch.prep.testbed import (
    AccuracyStop,
    build_testbed,
    command_for_testbed,
    prepare_warm,
    warm_config,
    yaml_of_testbed,
)
from launch.prep.testbed_prm import PrmRecipe, init_prm, label_responses, prm_dir, step_accuracy, train_prm
from learner.prm.pure import HFTokenClassificationPRM, make_prm, score_responses
from tasks import build_tiny_model
from tasks.arithmetic import Fault, level_config, make_splits, solve

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_heads=1", "model.tiny.num_layers=1",
        "model.tiny.intermediate_size=128", "data.train_prompts=64", "data.eval_prompts=4",
        "rollout.max_response_tokens=24"]


def tiny_cfg(tmp_path: Path, *more: str, algo: str = "pure"):
    return resolve(algo, str(yaml_of_testbed("steps")),
                   overrides=[f"model.cache_dir={tmp_path / 'cache'}", *TINY, *more])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", hidden_size=64, num_heads=1, num_layers=1,
                            intermediate_size=128)


def test_generation_is_deterministic_in_its_seed_and_stops_at_eos(tiny):
    from transformers import AutoModelForCausalLM

    tok, model = load_tokenizer(str(tiny)), AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    prompts = [encode_prompt(tok, [{"role": "user", "content": q}]) for q in ("What is 1+2?", "What is 12345+678?")]
    kw = dict(pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, max_new_tokens=12, batch=2)
    a, b = generate(model, prompts, sample=True, seed=1, **kw), generate(model, prompts, sample=True, seed=1, **kw)
    assert a == b and a != generate(model, prompts, sample=True, seed=2, **kw)
    assert generate(model, prompts, sample=False, **kw) == generate(model, prompts, sample=False, seed=9, **kw)
    for row in a:  # at most 12 tokens; an eos ends a row and is kept (the padding after it is not)
        assert len(row) <= 12 and tok.eos_token_id not in row[:-1]
        assert len(row) == 12 or row[-1] == tok.eos_token_id


def test_the_warm_up_stops_at_the_first_check_reaching_the_target(tmp_path):
    cfg = warm_config(tiny_cfg(tmp_path, "model.sft_warmup_steps=4"))
    logs = []
    never = AccuracyStop(cfg, target=1.0, every=2)  # a random model scores 0: checks at 2 and 4, no stop
    path = prepare_model(cfg, log=logs.append, until=never)
    assert [c["step"] for c in never.history] == [2, 4] and never.done == 4
    assert all(c["accuracy"] == 0.0 for c in never.history)
    at_once = AccuracyStop(cfg, target=0.0, every=2)  # any accuracy reaches 0: stops after step 2
    other = prepare_model(cfg, log=logs.append, until=at_once)
    assert at_once.done == 2 and "[sft] stopped after step 2 of at most 4" in logs
    assert other != path and (other / "config.json").is_file()  # the rule is part of the cache key
    assert prepare_model(cfg, until=AccuracyStop(cfg, target=0.0, every=2)) == other  # cached: no step again


def test_the_testbed_warm_model_learns_the_main_level_and_reports(tmp_path):
    cfg = tiny_cfg(tmp_path, "model.sft_warmup_steps=2", "data.arithmetic.level=steps-hard")
    path = prepare_warm(cfg, every=1)  # the run trains on steps-hard, its warm model on steps-main
    report = json.loads((path / "warmup.json").read_text())
    assert report["steps"] == 2 and [c["step"] for c in report["checks"]] == [1, 2]
    assert set(report["greedy_heldout_accuracy"]) == {"steps-main", "steps-hard"}
    assert path == prepare_warm(tiny_cfg(tmp_path, "model.sft_warmup_steps=2"), every=1)  # same model, any level


def demo_pairs(tok, n: int):
    """(prompt ids, response ids + eos) of `n` steps-main problems: each reference solution, and the same
    with a wrong digit in column 1 (so its steps are [1, 0, 0, ...]: the slip and everything after it)."""
    problems, _ = make_splits(n, 1, seed=0, config=level_config("steps-main"))
    pairs = []
    for p in problems:
        prompt = encode_prompt(tok, [{"role": "user", "content": p.prompt}])
        for text in (p.solution, "\n\n".join(solve(p, Fault(1, "digit", 1)))):
            pairs.append((prompt, tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
    return problems, pairs


def test_steps_are_labelled_by_the_checker_as_the_pure_provider_cuts_them(tiny):
    tok = load_tokenizer(str(tiny))
    problems, pairs = demo_pairs(tok, 3)
    items = label_responses(tok, pairs)
    for p, right, slipped in zip(problems, items[::2], items[1::2]):
        n = len(p.steps)
        assert right.labels == [1] * n and slipped.labels == [1] + [0] * (n - 1)
        assert len(right.spans) == n and right.response == p.solution and "What is" in right.prompt


def test_the_prm_trains_saves_and_scores_through_pure_prm_hf(tiny, tmp_path):
    tok = load_tokenizer(str(tiny))
    _, pairs = demo_pairs(tok, 8)
    items = label_responses(tok, pairs)
    out = init_prm(tiny, tmp_path / "prm", seed=0)
    losses = train_prm(out, items, PrmRecipe(steps=30, batch=8, lr=3e-3), seed=0, log=lambda m: None)
    assert losses["loss_last"] < losses["loss_first"]
    cfg = resolve("pure", overrides=["pure.prm=hf", f"pure.prm_path={out}"])
    prm = make_prm(cfg, torch.device("cpu"))  # what the learner's process_rewards provider builds
    assert isinstance(prm, HFTokenClassificationPRM) and prm.model.config.num_labels == 2
    scored = score_responses(prm, tok, pairs)
    for (ends, scores), item in zip(scored, items):
        assert len(ends) == len(scores) == len(item.spans)  # one score per step
        assert all(-1.0 <= s <= 1.0 for s in scores)
    acc = step_accuracy(prm, items)
    assert acc["steps"] == sum(len(it.labels) for it in items) and 0.0 <= acc["step_accuracy"] <= 1.0


def test_the_prm_is_cached_beside_its_warm_model_keyed_by_its_recipe(tmp_path):
    cfg, warm = tiny_cfg(tmp_path), tmp_path / "cache" / "tiny-abc-sft-def"
    a = prm_dir(cfg, warm)
    assert a.parent == warm.parent and a.name.startswith("tiny-abc-sft-def-prm-")
    assert prm_dir(cfg, warm, PrmRecipe(steps=61)) != a and prm_dir(tiny_cfg(tmp_path, "seed=1"), warm) != a


def test_the_command_line_gives_the_run_the_testbed_paths_and_builds_nothing_on_a_dry_run(tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["--algo", "pure", "--testbed", "steps", "--dry-run", "--set", f"model.cache_dir={cache}"]) == 0
    out = capsys.readouterr().out
    from launch.prep.testbed import warm_dir

    path = warm_dir(resolve("pure", str(yaml_of_testbed("steps")), overrides=[f"model.cache_dir={cache}"])).resolve()
    assert f"path: {path}  #" in out and "prm: hf" in out and f"prm_path: {path}-prm-" in out
    assert "level: steps-main" in out and not cache.exists()
    assert main(["--algo", "grpo", "--testbed", "steps", "--dry-run", "--set", f"model.cache_dir={cache}"]) == 0
    assert f"path: {path}  #" in capsys.readouterr().out  # every algorithm starts from the same warm model
    _, kept = command_for_testbed("steps", "pure", None, {}, ["pure.prm=rule"])
    assert not any(o.startswith("pure.prm_path") for o in kept)  # a PRM the user names is kept


def test_the_run_is_given_the_directories_the_build_makes(tmp_path):
    more = [f"model.cache_dir={tmp_path / 'cache'}", *TINY, "model.sft_warmup_steps=2"]
    _, overrides = command_for_testbed("steps", "grpo", None, {}, more)
    assert overrides[0].startswith("model.path=") and overrides[1:] == more  # no PRM for grpo; the user's keys last
    assert build_testbed("steps", "grpo", {}, more, log=lambda m: None) == [Path(overrides[0].split("=", 1)[1])]


@pytest.mark.parametrize("argv, message", [
    (["--config", "x.yaml"], "--testbed steps: lays"),
    (["--model", "/m"], "--model: --testbed steps trains its own warm model on its own task — drop --model"),
    (["--data", "d.jsonl"], "--data: --testbed steps trains its own warm model"),
    (["--resume", "runs/x"], "--testbed: runs/x's config.yaml already holds its testbed — drop --testbed"),
])
def test_what_the_testbed_replaces_is_refused_naming_the_flag(argv, message, capsys):
    assert main(["--algo", "pure", "--testbed", "steps", *argv, "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_testbed_is_refused():
    with pytest.raises(ConfigError, match="--testbed: unknown testbed 'words'; choose one of steps"):
        yaml_of_testbed("words")
