"""The chaos bench's ledger check (bench/chaos/chaos.py): prompts lost or trained twice by a finished run.

Read from the final checkpoint's prompt ledger (`launch.state.ledger`: every (epoch, prompt) trained, with
its step, and those the buffer discarded) and its buffer snapshot (the groups held), against a re-walk of
each actor's shard made here from the data and the config (the actors' documented order,
`actors/prompts.py`: actor a of N owns prompts a, a+N, ...; each epoch over the shard shuffled with
random.Random(f"{seed}/{a}/{epoch}")). The run drains its actors into the buffer before the final
checkpoint, so everything before the last settled prompt of a shard (its frontier) must be trained,
discarded or held: any other prompt there is *lost*. *Twice*: an (epoch, prompt) the ledger lists more than
once; also counted: trained prompts the buffer still holds (a resume would serve them again), and settled
keys that are in no shard's walk.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Key = tuple[int, int]  # (epoch, prompt_index)


def shard_walks(prompts: Sequence[int], actors: int, seed: int, epochs: int) -> list[list[Key]]:
    """Each actor's walk over its shard for `epochs` epochs: the (epoch, prompt_index) in the order the
    actor hands them out (module docstring), written here from the documented rule, not the actors' code."""
    walks = []
    for a in range(actors):
        shard = list(prompts[a::actors])
        walk: list[Key] = []
        for e in range(epochs):
            order = list(range(len(shard)))
            random.Random(f"{seed}/{a}/{e}").shuffle(order)
            walk += [(e, shard[j]) for j in order]
        walks.append(walk)
    return walks


@dataclass
class Audit:
    trained: int
    discarded: int
    held: int
    lost: list[Key] = field(default_factory=list)  # before its shard's frontier, neither trained, discarded nor held
    twice: list[Key] = field(default_factory=list)  # listed more than once as trained
    trained_and_held: list[Key] = field(default_factory=list)  # trained, yet still in the buffer
    foreign: list[Key] = field(default_factory=list)  # settled, but in no shard's walk
    frontiers: list[int] = field(default_factory=list)  # per shard: walk positions up to its last settled prompt


def audit(walks: Sequence[Sequence[Key]], trained: Iterable[Key], discarded: Iterable[Key],
          held: Iterable[Key]) -> Audit:
    """Lost and twice-trained prompts of a finished run (module docstring)."""
    counts = Counter(map(tuple, trained))
    discarded, held = set(map(tuple, discarded)), set(map(tuple, held))
    settled = set(counts) | discarded | held
    out = Audit(sum(counts.values()), len(discarded), len(held),
                twice=sorted(k for k, c in counts.items() if c > 1), trained_and_held=sorted(held & set(counts)))
    for walk in walks:
        frontier = max((i + 1 for i, k in enumerate(walk) if k in settled), default=0)
        out.frontiers.append(frontier)
        out.lost += [k for k in walk[:frontier] if k not in settled]
    out.foreign = sorted(settled - {k for walk in walks for k in walk})
    return out


def held_keys(snapshot: Path) -> list[Key]:
    """(epoch, prompt) of every group a buffer snapshot holds (read by the buffer's own restore)."""
    from buffer.core import BufferCore
    from buffer.settings import BufferSettings
    from buffer.snapshot import restore_snapshot

    core = BufferCore(BufferSettings())
    restore_snapshot(core, str(snapshot))
    return [g.key for g in core.queue]


def train_prompts(cfg, tokenizer_dir: Path) -> list[int]:
    """prompt_index of every training prompt the run's actors share out (over-long ones are skipped)."""
    from actors.prompts import items_from_records, load_tokenizer
    from launch.prep.data import load_prompt_records

    records, _ = load_prompt_records(cfg)
    items, _ = items_from_records(records, load_tokenizer(str(tokenizer_dir)), cfg.data.max_prompt_tokens)
    return [it.prompt_index for it in items]
