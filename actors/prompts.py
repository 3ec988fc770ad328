"""The prompts an actor works on: tokenised records, the actor's shard, and a resumable cursor.

Why tokenise once up front: the engine is fed token ids (not text), so what the actor sends to the
buffer as `Group.prompt_tokens` is exactly what the engine conditioned on, and the learner rebuilds
prompt + response from ids without re-running the chat template. Prompts longer than the budget are
skipped and counted, never silently truncated.

Sharding: actor `a` of `N` owns prompts `a, a+N, a+2N, ...` of the dataset (by position), so the
actors never duplicate work and the union of shards is the dataset. Each epoch over the shard is
shuffled with a seed of (seed, actor, epoch), so the order is a function of those three alone.

A restarted actor (or every actor of a resumed run) takes over its shard by walking it from the top
in that same order with `skip` = every (epoch, prompt) the driver's ledger accounts for (trained,
discarded by the buffer, or held by it: `launch.state.ledger`): what its predecessor had in flight or
undelivered is not in that set and so is generated again, and nothing in it is generated twice. The
walk past settled epochs is set lookups only. `requeue` serves given keys first (prompts a dead
buffer lost, `launch.state.buffer_keeper`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class PromptItem:
    """One prompt as the actor uses it. `prompt_index` is its index in the whole training set; `question`
    and `extra` are what the reward is given as prompt and extra (`tasks.rewards`); `demo_ids` is the
    prompt's demonstration (ids + eos) when the algorithm needs one (LUFFY), so it reaches the actor with
    its shard instead of by a request per guided prompt."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    ground_truth: str
    data_source: str = ""
    question: str = ""
    extra: dict = field(default_factory=dict, hash=False, compare=False)
    demo_ids: tuple[int, ...] | None = field(default=None, hash=False, compare=False)


@dataclass(frozen=True)
class PromptStyle:
    """How a record's messages become prompt token ids (config `data.prompt_format`, `data.system_prompt`,
    `data.chat_template`; `launch.prep.data.prompt_style` builds it). One style per run, applied here once,
    so the learner, the actors and `algo-train eval` condition on the same tokens.

    system_prompt: a system message put first unless the messages already start with one.
    chat_template: Jinja text used instead of the tokenizer's (None = the tokenizer's).
    raw: no template at all: the messages' contents joined by a blank line, tokenised as plain text
    (with whatever special tokens the tokenizer adds to plain text, e.g. a BOS, as vLLM does for a text
    prompt) -- base models have no chat template, and R1-Zero-style prompts are written out in full.
    tools: the JSON schemas of `env.tools` (`envs.tools.tool_schema`), given to the chat template as `tools=`
    so the model is offered them in its own format; None = no tools (the template renders as before).
    """

    system_prompt: str | None = None
    chat_template: str | None = None
    raw: bool = False
    tools: list[dict] | None = field(default=None, hash=False, compare=False)  # env.tools' schemas, offered

    def messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.system_prompt is None or (messages and messages[0]["role"] == "system"):
            return messages
        return [{"role": "system", "content": self.system_prompt}, *messages]

    def text(self, messages: list[dict[str, str]]) -> str:
        """The prompt text of raw mode."""
        return "\n\n".join(m["content"] for m in self.messages(messages))


def encode_prompt(tokenizer, messages: list[dict[str, str]], style: PromptStyle = PromptStyle()) -> list[int]:
    """Token ids of `messages` as `style` renders them: chat-templated with the generation prompt
    appended (default), or raw text."""
    if style.raw:
        ids = tokenizer(style.text(messages), add_special_tokens=True, verbose=False)["input_ids"]
    else:
        extra = {"tools": style.tools} if style.tools else {}  # no tools: exactly the call of a single-turn run
        ids = tokenizer.apply_chat_template(style.messages(messages), chat_template=style.chat_template,
                                            add_generation_prompt=True, tokenize=True, **extra)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def items_from_records(records: Sequence, tokenizer, max_prompt_tokens: int | None = None,
                       start_index: int = 0, style: PromptStyle = PromptStyle()) -> tuple[list[PromptItem], list[int]]:
    """`tasks.records.Record`s -> (items, indices of skipped over-long prompts), rendered by `style`.

    Record i becomes prompt_index start_index + i whether or not earlier ones were skipped, so the
    index always names the dataset row.
    """
    items, skipped = [], []
    for i, rec in enumerate(records):
        ids = encode_prompt(tokenizer, rec.prompt, style)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            skipped.append(start_index + i)
            continue
        items.append(PromptItem(start_index + i, tuple(ids), str(rec.ground_truth), rec.data_source, rec.question,
                                {**rec.extra_info, "data_source": rec.data_source}))
    return items, skipped


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The tokenizer of `model_dir` (trust_remote_code: config model.trust_remote_code)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def shard(items: Sequence[PromptItem], actor_id: int, num_actors: int) -> list[PromptItem]:
    """Actor `actor_id`'s share: every `num_actors`-th item starting at position `actor_id`."""
    if not 0 <= actor_id < num_actors:
        raise ValueError(f"actor_id {actor_id} out of range for {num_actors} actors")
    return list(items[actor_id::num_actors])


def with_demos(items: Sequence[PromptItem], demos: dict) -> list[PromptItem]:
    """`items`, each whose prompt index `demos` holds ({prompt index: ids + eos}) with that demonstration."""
    return [replace(it, demo_ids=tuple(int(t) for t in demos[it.prompt_index])) if it.prompt_index in demos else it
            for it in items]


class PromptCursor:
    """Endless iterator over a shard, reshuffled every epoch (module docstring: resuming = `skip`)."""

    def __init__(self, items: Iterable[PromptItem], seed: int = 0, actor_id: int = 0, shuffle: bool = True):
        self.items = list(items)
        if not self.items:
            raise ValueError(f"actor {actor_id}: its prompt shard is empty (more actors than prompts?)")
        self.seed, self.actor_id, self.shuffle = seed, actor_id, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()
        self._skip: set[tuple[int, int]] = set()
        self._by_index = {it.prompt_index: it for it in self.items}
        self._requeued: deque[tuple[int, int]] = deque()

    def skip(self, keys: Iterable) -> None:
        """Never hand out these (epoch, prompt_index) pairs: prompts a resumed or restarted run has
        already trained (or that the buffer holds), per the driver's ledger."""
        self._skip |= {(int(e), int(i)) for e, i in keys}

    def requeue(self, keys: Iterable) -> None:
        """Hand out these (epoch, prompt_index) pairs of this shard first, in order (prompts a crashed
        predecessor had started but not delivered); skipped ones are still skipped."""
        for e, i in keys:
            if int(i) not in self._by_index:
                raise ValueError(f"actor {self.actor_id}: prompt {i} is not in its shard")
            self._requeued.append((int(e), int(i)))

    def set_demos(self, demos: dict) -> None:
        """Give this shard's prompts these demonstrations ({prompt index: ids + eos}; others are not this
        shard's): a live teacher's traces (`launch.processes.teacher_role`) arriving during the run."""
        self.items = with_demos(self.items, demos)
        self._by_index.update((it.prompt_index, it) for it in self.items if it.prompt_index in demos)

    def _make_order(self) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"{self.seed}/{self.actor_id}/{self.epoch}").shuffle(order)
        return order

    def next(self) -> PromptItem:
        return self.next_keyed()[0]

    def next_keyed(self) -> tuple[PromptItem, int]:
        """The next prompt and the epoch (pass over the shard) it belongs to."""
        while self._requeued:
            key = self._requeued.popleft()
            if key not in self._skip:
                return self._by_index[key[1]], key[0]
        while True:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            item = self.items[self._order[self.position]]
            self.position += 1
            if (self.epoch, item.prompt_index) not in self._skip:
                return item, self.epoch
