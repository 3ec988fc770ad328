"""Multi-turn rollouts on an actor's engine: the `envs.multiturn.MultiTurn` of the run's `env:` section, and
one policy turn from one vLLM completion.

Each turn is a new request whose prompt is the trajectory's token ids so far (`actors.generate.GroupSampler
.sample_turns`), watched by the rollout deadlines like any request: the deadlines apply per turn. The turn's
row parts come from the completion exactly as single-turn rows do (`actors.rows`): its token ids, log mu
per token, and the weight version of each token from vLLM's spans, so a push between two turns shows up as
newer versions on the later turn.
"""

from __future__ import annotations

import functools
from pathlib import Path

from actors.prompts import PromptStyle, encode_prompt
from actors.rows import sampled_logprobs, versions_from_spans
from configs.data_section import is_template_file
from envs.environment import load_environment_class
from envs.episode import Limits, Turn
from envs.multiturn import MultiTurn
from envs.render import ObservationRenderer
from envs.tools import Toolbox, load_tool


def turn_of(completion) -> Turn:
    tokens = list(completion.token_ids)
    return Turn(tokens, sampled_logprobs(completion), versions_from_spans(completion.weight_versions, len(tokens)),
                str(completion.finish_reason))


def multiturn_builder(cfg, tokenizer):
    """None without `env:`; else a function of the sampler's `offload(fn, *args)` (runs fn on a thread and
    awaits it) that builds the actor's `MultiTurn`."""
    env = cfg.env
    if not env.enabled:
        return None
    template = cfg.data.chat_template
    if template is not None and is_template_file(template):
        template = Path(template).read_text(encoding="utf-8")
    toolbox = Toolbox([load_tool(s) for s in env.tools], env.call_timeout_s) if env.tools else None
    style = PromptStyle(cfg.data.system_prompt, template, tools=toolbox.schemas if toolbox else None)
    renderer = ObservationRenderer(tokenizer, template, style.tools)
    limits = Limits(env.max_turns, env.max_trajectory_tokens or cfg.rollout.max_response_tokens,
                    env.max_observation_tokens, env.call_timeout_s, env.max_turn_tokens)
    env_class = load_environment_class(env.environment) if env.environment else None
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)

    def build(offload) -> MultiTurn:
        async def render(messages, closed):
            return await offload(renderer.ids, messages, closed)

        async def decode_text(ids):
            return await offload(decode, ids)

        async def prompt_of(text):
            return await offload(encode_prompt, tokenizer, [{"role": "user", "content": text}], style)

        return MultiTurn(limits, toolbox=toolbox, env_class=env_class, render=render, decode=decode_text,
                         prompt_of=prompt_of, max_prompt_tokens=cfg.data.max_prompt_tokens)

    return build
