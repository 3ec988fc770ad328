"""The tools testbed's warm model: `algo-train --algo grpo --testbed tools` (`launch.prep.testbed`).

The task is the step-by-step testbed's steps-hard level (7-8 digit + and −), where a model that only writes
column steps scores 0.00: the warm model never saw a column of that length. The run offers the built-in exact
calculator (`env.tools: [calculator]`), so the one way to those answers is to call it.

The warm model (configs/testbeds/tools.yaml: the steps testbed's 4-layer shape) is SFT-warmed for
`model.sft_warmup_steps` steps (no accuracy stop) on the steps testbed's noisy column demonstrations of
steps-main problems, plus `HARD_DEMOS` steps-hard train problems answered bare (`\\boxed{N}`, no work: an
answer the model cannot compute, so it learns the form, not the sum). A seeded share of each (`TOOL_DEMO_SHARE`
of the first, `HARD_TOOL_SHARE` of the second) call the calculator instead, written as the rollout writes a
trajectory (`tool_demo`):

    [policy]       <tool_call>{"name": "calculator", "arguments": {"expression": "48213+9377"}}</tool_call></s>
    [environment]  <|user|><tool_response>57590</tool_response><|assistant|>     (envs.render: the chat template)
    [policy]       \\boxed{57590}</s>

The tool call is the Hermes/Qwen format `envs.tool_calls` reads; the environment tokens are the ones the
actor appends (`envs.render.ObservationRenderer`, the same template and tokenizer), marked as environment
tokens (`Sample.env_mask`): SFT takes no loss on them, as RL takes none. Why a minority share: on a steps-hard
prompt the warm model then answers bare, and wrongly, most of the time (greedy: always) and calls the tool in
about a third of its samples, so RL has a tool-call share and an accuracy to raise. Why steps-hard prompts
in the warm-up at all: with 4-5 digit tool demonstrations only, the warm model's tool calls on 7-8 digit
prompts came out garbled (0.3 % well-formed; `bench/tools_testbed.md`), and RL never saw a reward. Why 6000 of
them, 40 % with the tool, and 1200 steps: with 2000, a quarter, and 600 steps the warm model's calls slipped on
the operands and it did not copy the result into its answer, so no trajectory earned a reward; with these it
calls correctly (sampled accuracy 0.245 at a tool share of 0.33) and RL takes it to 0.96 in 25 steps.

The warm model is cached beside the steps testbed's (`warm_plan`'s key of the same warm-up, plus the key of
the tool demonstrations: `tools_warm_dir`); its `warmup.json` holds the build's seconds and the warm policy's
behaviour on the run's held-out prompts (`tool_behaviour`: greedy and sampled accuracy and tool-call share).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import numpy as np

from configs.schema import RunConfig

TOOL_DEMO_SHARE = 0.25  # share of the warm-up's steps-main (column) demonstrations that call the calculator
HARD_TOOL_SHARE = 0.4  # share of its steps-hard demonstrations that call it (the rest answer bare): below 1/2
HARD_DEMOS = 6000  # steps-hard train problems in the warm-up
TOOL_DEMO_FORMAT = 3  # bump when the demonstrations change: it enters the cache key
TOOL = "calculator"
HARD = "steps-hard"  # the run's level (configs/testbeds/tools.yaml)


def tool_call_text(expression: str) -> str:
    """The policy's first turn: one Hermes/Qwen tool call of the calculator (`envs.tool_calls`)."""
    return "<tool_call>" + json.dumps({"name": TOOL, "arguments": {"expression": expression}}) + "</tool_call>"


def tool_demo(problem, tokenizer, renderer) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, environment mask) of a two-turn demonstration of `problem` (module docstring): the call and
    its eos, the calculator's result rendered by `renderer` (an `envs.render.ObservationRenderer` of the run's
    template), the boxed result and its eos."""
    from envs.builtin_tools import calculator

    expression = f"{problem.a}{problem.op}{problem.b}"
    result = calculator(expression)
    if result != problem.answer:
        raise AssertionError(f"calculator({expression!r}) = {result}, expected {problem.answer}")
    eos = tokenizer.eos_token_id

    def text_ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    call = [*text_ids(tool_call_text(expression)), eos]
    obs = renderer.ids([{"role": "tool", "name": TOOL, "content": result}], closed=True)
    answer = [*text_ids(f"\\boxed{{{result}}}"), eos]
    ids = np.asarray(call + obs + answer, np.int32)
    env = np.zeros(len(ids), bool)
    env[len(call):len(call) + len(obs)] = True
    return ids, env


def tools_warm_dir(wcfg: RunConfig) -> Path:
    """Where the warm model of the warm-up config `wcfg` (`launch.prep.testbed.warm_config`) is cached."""
    from launch.prep.model_prep import _key, warm_plan

    plain = warm_plan(wcfg)[0]
    key = _key({"share": TOOL_DEMO_SHARE, "hard_share": HARD_TOOL_SHARE, "hard": HARD_DEMOS,
                "format": TOOL_DEMO_FORMAT, "tool": TOOL})
    return plain.with_name(f"{plain.name}-tools-{key}")


def warmup_demos(wcfg: RunConfig, tokenizer, style, hard: int = HARD_DEMOS) -> tuple[dict, dict, dict]:
    """(demo ids, prompt ids, environment masks) by key (module docstring): the noisy column demonstrations of
    `wcfg`'s train problems (keys 0...), then `hard` steps-hard train problems answered bare, `\\boxed{N}` (keys
    from `wcfg.data.train_prompts` on); a seeded `TOOL_DEMO_SHARE` of the first and `HARD_TOOL_SHARE` of the
    second replaced by tool demonstrations."""
    from actors.prompts import encode_prompt
    from envs.render import ObservationRenderer
    from launch.prep.data import arithmetic_config, tokenize_demos
    from tasks import demonstration_records, make_splits
    from tasks.arithmetic import level_config, sample_problems

    train, _ = make_splits(wcfg.data.train_prompts, wcfg.data.eval_prompts, seed=wcfg.data.seed,
                           config=arithmetic_config(wcfg))
    records = demonstration_records(train, error_rate=wcfg.model.sft_error_rate, seed=wcfg.data.seed)
    demos = tokenize_demos(records, records, tokenizer, Path("synthetic demonstrations"))
    problems = dict(enumerate(train))
    for k, p in enumerate(sample_problems(hard, split="train", seed=wcfg.data.seed, config=level_config(HARD)) if hard
                          else []):
        key = len(train) + k
        problems[key] = p
        demos[key] = np.asarray([*tokenizer(f"\\boxed{{{p.answer}}}", add_special_tokens=False)["input_ids"],
                                 tokenizer.eos_token_id], np.int32)
    prompts = {i: tuple(encode_prompt(tokenizer, [{"role": "user", "content": problems[i].prompt}], style))
               for i in demos}
    renderer = ObservationRenderer(tokenizer, style.chat_template, style.tools)
    rng = random.Random(f"{wcfg.data.seed}:tool-demos")
    env = {}
    for i in sorted(demos):
        if rng.random() < (HARD_TOOL_SHARE if i >= len(train) else TOOL_DEMO_SHARE):
            demos[i], env[i] = tool_demo(problems[i], tokenizer, renderer)
    return demos, prompts, env


def prepare_tools_warm(wcfg: RunConfig, heldout_cfg: RunConfig, log=print) -> Path:
    """The cached warm model of `wcfg` (built if missing, module docstring); a build writes `warmup.json` with the
    warm policy's `tool_behaviour` on the held-out prompts of `heldout_cfg` (the run's level)."""
    from actors.prompts import load_tokenizer
    from launch.prep.data import prompt_style
    from launch.prep.model_prep import base_model_dir, run_sft, warm_plan

    out = tools_warm_dir(wcfg)
    if (out / "config.json").is_file():  # it appears by a rename, complete
        return out
    start = time.monotonic()
    init = base_model_dir(wcfg)
    _, sft_cfg = warm_plan(wcfg)
    style = prompt_style(wcfg)
    tokenizer = load_tokenizer(str(init))
    demos, prompts, env = warmup_demos(wcfg, tokenizer, style)
    log(f"[model] warming the tools testbed's model up: {wcfg.model.sft_warmup_steps} SFT steps on noisy column "
        f"demonstrations, {len(env)} of {len(demos)} calling the calculator instead; cached in {out}")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    run_sft(sft_cfg, init, demos, prompts, wcfg.model.sft_warmup_steps, tmp, log, env=env)
    built = time.monotonic() - start
    behaviour = tool_behaviour(heldout_cfg, tmp)
    log(f"[model] warm policy on the held-out {heldout_cfg.data.arithmetic.level} prompts: " +
        ", ".join(f"{k} {v:.3f}" for k, v in behaviour.items()))
    report = {"steps": wcfg.model.sft_warmup_steps, "tool_demos": len(env), "demos": len(demos),
              "tool_demo_share": TOOL_DEMO_SHARE, "hard_tool_share": HARD_TOOL_SHARE, "sft_seconds": round(built, 1),
              "check_seconds": round(time.monotonic() - start - built, 1), "heldout": behaviour}
    (tmp / "warmup.json").write_text(json.dumps(report, indent=1) + "\n")
    tmp.rename(out)
    return out


def tool_behaviour(cfg: RunConfig, model_dir: Path, samples: int = 2) -> dict[str, float]:
    """The policy in `model_dir` on `cfg`'s held-out prompts, each response run through `cfg`'s tools turn by turn
    as a rollout runs it (`episodes`): accuracy and tool-call share, greedy and sampled at temperature 1
    (`samples` per prompt)."""
    import torch
    from transformers import AutoModelForCausalLM

    from actors.prompts import encode_prompt, load_tokenizer
    from envs.render import ObservationRenderer
    from envs.tools import load_tool
    from launch.prep.data import arithmetic_config, prompt_style
    from tasks import make_splits, reward

    tokenizer = load_tokenizer(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    style = prompt_style(cfg)
    renderer = ObservationRenderer(tokenizer, style.chat_template, style.tools)
    _, held = make_splits(cfg.data.train_prompts, cfg.data.eval_prompts, seed=cfg.data.seed,
                          config=arithmetic_config(cfg))
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": p.prompt}], style) for p in held]
    tools = {fn.__name__: fn for fn in (load_tool(s) for s in cfg.env.tools)}
    out = {}
    for name, sample, reps in (("greedy", False, 1), ("sampled", True, samples)):
        texts, called = episodes([p for p in prompts for _ in range(reps)], model, tokenizer, renderer, tools,
                                 cfg.env.max_turns, cfg.rollout.max_response_tokens, sample, cfg.seed)
        answers = [p.answer for p in held for _ in range(reps)]
        out[f"{name}_accuracy"] = sum(map(reward, texts, answers)) / len(texts)
        out[f"{name}_tool_share"] = sum(called) / len(called)
    return out


def episodes(prompts: list[list[int]], model, tokenizer, renderer, tools: dict, max_turns: int, max_tokens: int,
             sample: bool, seed: int) -> tuple[list[str], list[bool]]:
    """(each response's text with special tokens skipped, whether it got a tool result): the turn loop of
    `envs.episode.run_episode` in batches of plain transformers generation — a turn that ends with eos and
    calls tools gets their results (a malformed call its error) rendered by `renderer` and goes on, up to
    `max_turns` turns and `max_tokens` response tokens."""
    from envs.tool_calls import parse_tool_calls
    from launch.prep.policy_samples import generate

    eos = tokenizer.eos_token_id
    responses: list[list[int]] = [[] for _ in prompts]
    called = [False] * len(prompts)
    active = list(range(len(prompts)))
    for turn in range(max_turns):
        room = max_tokens - min(len(responses[i]) for i in active)
        outs = generate(model, [list(prompts[i]) + responses[i] for i in active], pad_id=tokenizer.pad_token_id,
                        eos_id=eos, max_new_tokens=room, sample=sample, seed=seed + turn)
        going = []
        for i, out in zip(active, outs):
            out = out[:max_tokens - len(responses[i])]
            responses[i] += out
            calls = parse_tool_calls(tokenizer.decode(out, skip_special_tokens=True))
            if not calls or not out or out[-1] != eos or turn == max_turns - 1:
                continue
            messages = [{"role": "tool", "name": c.name, "content": _result(c, tools)} for c in calls]
            obs = renderer.ids(messages, True)
            if len(responses[i]) + len(obs) >= max_tokens:
                continue
            responses[i] += obs
            called[i] = True
            going.append(i)
        active = going
        if not active:
            break
    return tokenizer.batch_decode(responses, skip_special_tokens=True), called


def _result(call, tools: dict) -> str:
    """What a call gets back, as `envs.episode.ToolSteps` answers it (no time limit: the built-in calculator)."""
    if call.error is not None:
        return call.error
    fn = tools.get(call.name)
    if fn is None:
        return f"error: unknown tool {call.name!r}; the tools are {', '.join(tools)}"
    try:
        return str(fn(**call.arguments))
    except TypeError as e:
        return f"error: {call.name}: {e}"
