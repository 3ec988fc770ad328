"""The typed row every dataset becomes, and the veRL layout it is written in.

Why: actors, the LUFFY demonstration store and SFT all read prompts, ground truths and teacher
trajectories; one dataclass (`Record`) keeps them from each parsing raw parquet/JSONL rows. Files are
written in the veRL parquet layout (REFERENCE_NOTES §6.2, §4.1) so veRL-made data and ours are
interchangeable: ``data_source``, ``prompt`` (chat list), ``ability``, ``reward_model {style,
ground_truth}``, ``extra_info``, and LUFFY's ``target`` (a list with one assistant message).
`tasks.loaders.load_records` reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A dataset file or row that cannot be used; the message names the file, row and field."""


@dataclass
class Record:
    """One prompt with its ground truth and, for teacher files, a demonstration.

    prompt: chat messages ``{"role", "content"}`` (a plain-string prompt becomes one user message).
    ground_truth: the reference final answer. target: the demonstration (LUFFY/SFT), or None.
    """

    prompt: list[dict[str, str]]
    ground_truth: str
    target: str | None = None
    data_source: str = ""
    ability: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def question(self) -> str:
        """Content of the last user message (the problem statement)."""
        users = [m["content"] for m in self.prompt if m["role"] == "user"]
        return users[-1] if users else self.prompt[-1]["content"]

    def to_row(self) -> dict[str, Any]:
        """The veRL-layout row of this record."""
        return {
            "data_source": self.data_source,
            "prompt": [dict(m) for m in self.prompt],
            "ability": self.ability,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": dict(self.extra_info),
            "target": None if self.target is None else [{"role": "assistant", "content": self.target}],
        }


def write_records(path: str | Path, records: Iterable[Record]) -> Path:
    """Write `records` as veRL-layout rows to `path` (``.jsonl`` or ``.parquet``); returns the path.

    In parquet, ``extra_info`` is one struct column: a row reads back with every key any row has
    (None where it had none).
    """
    path = Path(path)
    rows = [r.to_row() for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for row in rows:  # parquet cannot store a struct without fields; null reads back as {}
            row["extra_info"] = row["extra_info"] or None
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise DataError(f"{path}: unknown format (expected .jsonl or .parquet)")
    return path
