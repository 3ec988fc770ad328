"""A scripted policy for the turn loop: `generate` returns the next scripted turn as token ids (one id per
character of the tiny model's tokenizer), with a weight version the test sets."""

from __future__ import annotations

import numpy as np

from envs.episode import Limits, Turn
from tasks.tiny_model import build_tokenizer

TOKENIZER = build_tokenizer()
EOS = TOKENIZER.eos_token_id


def ids(text: str) -> list[int]:
    return list(TOKENIZER(text, add_special_tokens=False)["input_ids"])


class ScriptedPolicy:
    """Turn k is `turns[k]` + eos (finish "stop"), cut to the budget (finish "length"); every token of a turn
    carries `version` at the time of the call; `prompts` records each request's prompt ids."""

    def __init__(self, turns: list[str], version: int = 3):
        self.turns, self.version, self.prompts = list(turns), version, []

    async def __call__(self, prompt: list[int], max_tokens: int) -> Turn:
        self.prompts.append(list(prompt))
        text = self.turns[len(self.prompts) - 1] if len(self.prompts) <= len(self.turns) else self.turns[-1]
        toks = ids(text) + [EOS]
        finish = "stop"
        if len(toks) > max_tokens:
            toks, finish = toks[:max_tokens], "length"
        lp = -np.arange(1, len(toks) + 1, dtype=np.float32) / 10
        return Turn(toks, lp, np.full(len(toks), self.version, np.int32), finish)


async def render_with(renderer, messages, closed=True):
    return renderer.ids(messages, closed)


async def decode(tokens):
    return TOKENIZER.decode(tokens, skip_special_tokens=True)


def limits(max_turns=4, max_tokens=200, obs=100, timeout_s=5.0) -> Limits:
    return Limits(max_turns, max_tokens, obs, timeout_s)
