"""Observations as token ids: the chat template's own text for tool results and user messages, tokenized once.

A multi-turn trajectory is kept as token ids (`envs.episode`). After a policy turn that ended with its eos
token, an observation (tool results, or an environment's message) is appended as the text the chat
template would put there: the rest of the closed assistant turn the policy did not sample (e.g. Qwen's
"\\n" after `<|im_end|>`), the observation's messages, and the generation prompt of the next assistant
turn. That text is found by rendering a fixed two-message conversation with and without the new messages
and taking the difference; it is tokenized once (no special tokens added) and never joined to the policy's
text, whose tokens stay exactly as sampled (veRL's agent loop and TRL do the same).
"""

from __future__ import annotations

_USER, _ASSISTANT = "U\u2063", "A\u2063"  # placeholders no template rewrites (an invisible separator)


class ObservationRenderer:
    """`ids(messages)`: the token ids appended after a policy turn for these messages (module docstring)."""

    def __init__(self, tokenizer, chat_template: str | None = None, tools: list[dict] | None = None):
        self.tokenizer, self.chat_template, self.tools = tokenizer, chat_template, tools or None
        self._base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        base = self._render(self._base, False)
        tail = base[base.rindex(_ASSISTANT) + len(_ASSISTANT):]
        eos = tokenizer.eos_token or ""
        self._glue = tail[len(eos):] if eos and tail.startswith(eos) else tail
        self._tail = tail  # after a turn cut by env.max_turn_tokens: the template's end of turn, eos included
        self._base_text = base

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, chat_template=self.chat_template,
                                                  add_generation_prompt=generation_prompt, tokenize=False)

    def text(self, messages: list[dict], closed: bool = True) -> str:
        """The text appended after a policy turn that ended with eos (`closed`), or that was cut at
        env.max_turn_tokens (not closed: the turn's end, eos included, comes first)."""
        full = self._render(self._base + list(messages), True)
        if not full.startswith(self._base_text):
            raise ValueError("the chat template renders earlier messages differently once more follow; "
                             "multi-turn rollouts need a template that only appends")
        return (self._glue if closed else self._tail) + full[len(self._base_text):]

    def ids(self, messages: list[dict], closed: bool = True) -> list[int]:
        return list(self.tokenizer(self.text(messages, closed), add_special_tokens=False)["input_ids"])
