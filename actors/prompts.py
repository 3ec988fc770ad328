"""The prompts an actor works on: tokenised records, the actor's shard, and a resumable cursor.

Why tokenise once up front: the engine is fed token ids (not text), so what the actor sends to the
buffer as `Group.prompt_tokens` is exactly what the engine conditioned on, and the learner rebuilds
prompt + response from ids without re-running the chat template. Prompts longer than the budget are
skipped and counted, never silently truncated.

Sharding: actor `a` of `N` owns prompts `a, a+N, a+2N, ...` of the dataset (by position), so the
actors never duplicate work and the union of shards is the dataset. Each epoch over the shard is
shuffled with a seed of (seed, actor, epoch); `PromptCursor.state_dict` records (epoch, position) for
exact resume.

A restarted actor takes over its predecessor's shard where it left off: the driver hands the new
cursor the last (epoch, position) the dead actor reported (`load_state_dict`) and the prompts it had
handed out but not delivered by then (`requeue`: served first); prompts handed out after that report
lie beyond the position, so they come round again too. `skip` drops whatever was trained or is held
by the buffer meanwhile, so a shard's prompt is neither lost with a crashed actor nor trained twice.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PromptItem:
    """One prompt as the actor uses it. `prompt_index` is its index in the whole training set; `question`
    and `extra` are what the reward is given as prompt and extra (`tasks.rewards`)."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    ground_truth: str
    data_source: str = ""
    question: str = ""
    extra: dict = field(default_factory=dict, hash=False, compare=False)


def encode_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Chat-templated token ids of `messages` with the generation prompt appended."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def items_from_records(records: Sequence, tokenizer, max_prompt_tokens: int | None = None,
                       start_index: int = 0) -> tuple[list[PromptItem], list[int]]:
    """`tasks.records.Record`s -> (items, indices of skipped over-long prompts).

    Record i becomes prompt_index start_index + i whether or not earlier ones were skipped, so the
    index always names the dataset row.
    """
    items, skipped = [], []
    for i, rec in enumerate(records):
        ids = encode_prompt(tokenizer, rec.prompt)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            skipped.append(start_index + i)
            continue
        items.append(PromptItem(start_index + i, tuple(ids), str(rec.ground_truth), rec.data_source, rec.question,
                                {**rec.extra_info, "data_source": rec.data_source}))
    return items, skipped


def load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def shard(items: Sequence[PromptItem], actor_id: int, num_actors: int) -> list[PromptItem]:
    """Actor `actor_id`'s share: every `num_actors`-th item starting at position `actor_id`."""
    if not 0 <= actor_id < num_actors:
        raise ValueError(f"actor_id {actor_id} out of range for {num_actors} actors")
    return list(items[actor_id::num_actors])


class PromptCursor:
    """Endless iterator over a shard, reshuffled every epoch; resumable from `state_dict`."""

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

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "size": len(self.items)}

    def load_state_dict(self, state: dict) -> None:
        if int(state["size"]) != len(self.items):
            raise ValueError(f"prompt cursor saved over {state['size']} prompts, this shard has {len(self.items)}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._make_order()
