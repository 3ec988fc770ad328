"""The tools testbed (`--testbed tools`: `launch.prep.testbed`, `launch.prep.testbed_tools`): its config as the
command line resolves it, the algorithms it refuses, the two-turn tool demonstrations (environment tokens as a
rollout appends them, no SFT loss on them) and a warm-up at tiny sizes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from configs.loading import ConfigError, resolve
from envs.episode import ToolSteps, Trajectory
from envs.render import ObservationRenderer
from envs.tools import Toolbox, load_tool
from launch.prep.data import prompt_style
from launch.prep.demo_batches import DemoBatches
from launch.prep.testbed import command_for_testbed, warm_config, warm_dir, yaml_of_testbed
from launch.prep.testbed_tools import (
    HARD_TOOL_SHARE,
    TOOL_DEMO_SHARE,
    prepare_tools_warm,
    tool_demo,
    warmup_demos,
)
from tasks.arithmetic import Problem
from tasks.tiny_model import build_tokenizer

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_heads=1", "model.tiny.num_layers=1",
        "model.tiny.intermediate_size=128", "data.train_prompts=64", "data.eval_prompts=4",
        "rollout.max_response_tokens=24"]


def test_the_testbed_resolves_to_hard_problems_with_the_calculator(tmp_path):
    config, sets = command_for_testbed("tools", "grpo", None, {}, [f"model.cache_dir={tmp_path}"])
    assert config == str(yaml_of_testbed("tools"))
    cfg = resolve("grpo", config, overrides=sets)
    assert cfg.env.tools == ["calculator"] and cfg.data.arithmetic.level == "steps-hard"
    assert cfg.model.path == str(warm_dir(cfg, "tools").resolve())
    # its own cache entry, beside the steps testbed's warm model of the same shape
    assert "-tools-" in Path(cfg.model.path).name and warm_dir(cfg, "tools") != warm_dir(cfg, "steps")
    for algo in ("rloo", "pacs", "prime"):  # every algorithm that trains on multi-turn rows takes it
        config, sets = command_for_testbed("tools", algo, None, {}, [f"model.cache_dir={tmp_path}"])
        assert resolve(algo, config, overrides=sets).env.tools == ["calculator"]


@pytest.mark.parametrize("algo", ["luffy", "sft"])
def test_algorithms_without_multi_turn_rows_are_refused_naming_why(algo):
    with pytest.raises(ConfigError, match=f"--algo {algo} does not train on multi-turn rows"):
        command_for_testbed("tools", algo, None, {}, [])


def test_pure_takes_the_testbed_with_a_prm_of_the_users_only(tmp_path):
    with pytest.raises(ConfigError, match="the tools testbed trains no PRM .* pure.prm=FILE.py:FUNCTION"):
        command_for_testbed("tools", "pure", None, {}, [])
    prm = "bench/evidence/prm_rules.py:biased_steps"
    config, sets = command_for_testbed("tools", "pure", None, {}, [f"model.cache_dir={tmp_path}", f"pure.prm={prm}"])
    cfg = resolve("pure", config, overrides=sets)
    assert cfg.env.tools == ["calculator"] and cfg.pure.prm.endswith(prm)  # the file's path made absolute


def test_the_testbed_refuses_a_model_or_a_config_file():
    with pytest.raises(ConfigError, match="--model: --testbed tools trains its own warm model"):
        command_for_testbed("tools", "grpo", None, {"model.path": "/m"}, [])
    with pytest.raises(ConfigError, match="--testbed tools: lays"):
        command_for_testbed("tools", "grpo", "my.yaml", {}, [])


def test_a_tool_demonstration_is_the_rollout_s_trajectory_with_environment_tokens_marked():
    tok = build_tokenizer()
    renderer = ObservationRenderer(tok)
    ids, env = tool_demo(Problem(48213, "+", 9377), tok, renderer)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "48213+9377"}}</tool_call>'
    assert tok.decode(ids[~env]) == call + "</s>\\boxed{57590}</s>"
    # the environment tokens are exactly what the actor appends after a closed turn calling the calculator
    toolbox = Toolbox([load_tool("calculator")], timeout_s=5)
    messages, _, done = asyncio.run(ToolSteps(toolbox).step(call, Trajectory()))
    toolbox.close()
    assert not done and list(ids[env]) == renderer.ids(messages, True)
    assert tok.decode(ids[env]) == "<|user|><tool_response>57590</tool_response><|assistant|>"
    # one contiguous span, after the call's eos
    where = np.flatnonzero(env)
    assert (np.diff(where) == 1).all() and ids[where[0] - 1] == tok.eos_token_id
    # as an SFT row: environment tokens are neither demonstration (loss) tokens nor policy tokens
    batches = DemoBatches({0: ids}, {0: (1, 2)}, per_step=1, seed=0, env={0: env})
    sample = batches.next()[0].samples[0]
    assert (sample.env_mask == env).all() and (sample.prefix_mask == ~env).all()


def test_the_warm_up_mixes_a_share_of_tool_demonstrations_and_reports_the_warm_policy(tmp_path):
    cfg = resolve("grpo", str(yaml_of_testbed("tools")),
                  overrides=[f"model.cache_dir={tmp_path / 'cache'}", *TINY, "model.sft_warmup_steps=2",
                             "data.train_prompts=400"])
    wcfg = warm_config(cfg)
    tok = build_tokenizer()
    demos, prompts, env = warmup_demos(wcfg, tok, prompt_style(wcfg), hard=100)
    assert set(env) <= set(demos) == set(prompts) == set(range(500))
    main, hard = [i for i in env if i < 400], [i for i in env if i >= 400]
    assert abs(len(main) / 400 - TOOL_DEMO_SHARE) < 0.07  # seeded draws: 400 demos, sd 0.022
    assert abs(len(hard) / 100 - HARD_TOOL_SHARE) < 0.15  # 100 demos, sd 0.049
    assert all(env[i].any() and not np.asarray(env[i])[-1] for i in env)
    bare = [i for i in range(400, 500) if i not in env]  # steps-hard problems answered bare
    for i in bare[:3]:
        question = tok.decode(list(prompts[i]))
        p = Problem.from_prompt(question)
        assert len(str(p.a)) >= 7 and tok.decode(list(demos[i])) == f"\\boxed{{{p.answer}}}</s>"
    assert any(i >= 400 for i in env) and any(i < 400 for i in env)  # tool demonstrations on both levels

    small = resolve("grpo", str(yaml_of_testbed("tools")),
                    overrides=[f"model.cache_dir={tmp_path / 'cache'}", *TINY, "model.sft_warmup_steps=2"])
    logs: list[str] = []
    path = prepare_tools_warm(warm_config(small), small, log=logs.append)
    report = json.loads((path / "warmup.json").read_text())
    assert report["steps"] == 2 and set(report["heldout"]) == {"greedy_accuracy", "greedy_tool_share",
                                                                "sampled_accuracy", "sampled_tool_share"}
    assert path == warm_dir(small, "tools") and any("calling the calculator instead" in m for m in logs)
    assert prepare_tools_warm(warm_config(small), small, log=logs.append) == path  # cached


def test_env_tool_share_is_the_batch_share_of_generated_rows_with_environment_tokens():
    from buffer.records import Group, Sample
    from launch.loop.metrics import tool_rows

    def row(env_tokens: int, demo: bool = False) -> Sample:
        env = np.zeros(6, bool)
        env[2:2 + env_tokens] = True
        return Sample(np.arange(6), np.zeros(6), np.zeros(6, np.int32), np.zeros(6, bool), 1.0,
                      finish_reason="demo" if demo else "stop", env_mask=env)

    groups = [Group("g0", 0, np.arange(3), [row(2), row(0), row(0)]), Group("g1", 1, np.arange(3), [row(1), row(3, True)])]
    counts = {"env/trajectories": 9}
    # 4 generated rows (the demonstration row is left out), 2 of them hold environment tokens: 2/4
    assert tool_rows(groups, counts) == {"env/trajectories": 9, "env/tool_share": 0.5}
    assert tool_rows(groups, {}) == {}  # a single-turn run: no env/* key at all
