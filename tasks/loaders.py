"""Loaders for dataset and teacher files (JSONL or parquet) in the common layouts.

Why strict: a malformed row found mid-run would crash an actor hours in, or silently train on garbage.
`load_records` validates every row up front and either returns all of them or raises one `DataError`
naming the file, the line (JSONL) or row (parquet, 1-based) and the field. Nothing is half-loaded.

Layouts (`LAYOUTS`), recognised from the first row's columns:

* veRL (a ``prompt`` column): ``prompt`` (string or chat list), ground truth ``reward_model.ground_truth``
  (else a top-level ``answer``), demonstration ``target``, ``data_source``, ``ability``, ``extra_info``;
* problem/answer/solution (a ``problem`` column; MATH, MATH-500 as shipped): prompt ``problem``, ground
  truth ``answer``, demonstration ``solution``;
* question/answer (a ``question`` column; GSM8K): prompt ``question``; the ``answer`` text holds the
  reasoning, ``####`` and the final answer: the ground truth is what follows the last ``####`` (thousands
  separators dropped: ``1,000`` -> ``1000``), the demonstration is the reasoning followed by
  ``\\boxed{ground truth}``. An answer without ``####`` is the ground truth and the demonstration as is.

`fields` (config ``data.fields``) overrides columns of the recognised layout; dotted paths reach into
nested objects. Field values: ``prompt`` a non-empty string or a chat list of ``{role, content}`` strings;
``ground_truth`` a non-empty string (numbers are turned into strings); ``target`` a non-empty string or a
list with one assistant message, optional unless ``require_target=True`` (teacher files);
``data_source`` (default: the file's stem), ``ability`` (default ""), ``extra_info`` (default: the
row's columns that no field uses, e.g. MATH-500's ``id``, ``level``, ``type``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.records import DataError, Record

Columns = str | tuple[str, ...]  # a dotted column path, or candidates tried in order
DEFAULT_FIELDS: dict[str, Columns] = {
    "prompt": "prompt",
    "ground_truth": ("reward_model.ground_truth", "answer"),
    "target": "target",
    "data_source": "data_source",
    "ability": "ability",
    "extra_info": "extra_info",
}
MATH500_FIELDS: dict[str, str] = {"prompt": "problem", "target": "solution", "ground_truth": "answer"}
CONFIG_NAMES = {"prompt": "prompt", "ground_truth": "answer", "target": "solution"}  # ours -> data.fields key


@dataclass(frozen=True)
class Layout:
    """How a file's columns map to `Record` fields. split_answer: GSM8K's ``reasoning #### answer``."""

    name: str
    fields: Mapping[str, Columns]
    split_answer: bool = False

    def describe(self) -> str:
        """One line, e.g. ``problem/answer/solution (prompt <- problem, answer <- answer, solution <- solution)``."""
        cols = ", ".join(f"{CONFIG_NAMES[k]} <- {' or '.join(_candidates(self.fields[k]))}" for k in CONFIG_NAMES)
        return f"{self.name} ({cols}{', answer after the last ####' if self.split_answer else ''})"


LAYOUTS = {  # recognised by the first column named here that the first row has
    "prompt": Layout("veRL", DEFAULT_FIELDS),
    "problem": Layout("problem/answer/solution", {**DEFAULT_FIELDS, **MATH500_FIELDS}),
    "question": Layout("question/answer (GSM8K)", {**DEFAULT_FIELDS, "prompt": "question", "ground_truth": "answer",
                                                   "target": "answer"}, split_answer=True),
}

_MISSING = object()
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


def detect_layout(row: Any, fields: Mapping[str, Columns] | None = None) -> Layout:
    """The layout of a file whose first row is `row` (veRL when nothing is recognised), with `fields`
    overriding its columns (a GSM8K answer is split only while the ground truth stays ``answer``)."""
    unknown = set(fields or {}) - set(DEFAULT_FIELDS)
    if unknown:
        raise ValueError(f"unknown field names {sorted(unknown)}; known: {sorted(DEFAULT_FIELDS)}")
    keys = row if isinstance(row, dict) else {}
    base = next((lay for key, lay in LAYOUTS.items() if key in keys), LAYOUTS["prompt"])
    if not fields:
        return base
    given = ", ".join(f"{CONFIG_NAMES.get(k, k)}={v}" for k, v in fields.items())
    return Layout(f"{base.name} with data.fields {given}", {**base.fields, **fields},
                  base.split_answer and "ground_truth" not in fields)


def load_dataset(path: str | Path, fields: Mapping[str, Columns] | None = None, *,
                 require_target: bool = False) -> tuple[list[Record], Layout]:
    """All rows of a ``.jsonl`` or ``.parquet`` file as `Record`s and the layout read, or a `DataError`."""
    path = Path(path)
    rows = _read_rows(path)
    layout = detect_layout(rows[0][1] if rows else {}, fields)
    unit = "line" if path.suffix == ".jsonl" else "row"
    return [_record(path, f"{unit} {n}", row, layout, require_target) for n, row in rows], layout


def load_records(path: str | Path, fields: Mapping[str, Columns] | None = None, *,
                 require_target: bool = False) -> list[Record]:
    """`load_dataset` without the layout."""
    return load_dataset(path, fields, require_target=require_target)[0]


def _read_rows(path: Path) -> list[tuple[int, Any]]:
    """(row number, raw row) pairs; JSONL rows are numbered by line and blank lines are skipped."""
    if path.suffix == ".jsonl":
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: cannot read file: {e}") from e
        rows = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {n}: invalid JSON: {e}") from e
        return rows
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: cannot read parquet file: {e}") from e
        return list(enumerate(table.to_pylist(), 1))
    raise DataError(f"{path}: unknown format (expected .jsonl or .parquet)")


def _candidates(paths: Columns) -> tuple[str, ...]:
    return (paths,) if isinstance(paths, str) else paths


def _lookup(row: dict, paths: Columns) -> tuple[Any, str]:
    """The first present, non-null value among the dotted `paths`, and the path it came from."""
    for dotted in _candidates(paths):
        value: Any = row
        for key in dotted.split("."):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING and value is not None:
            return value, dotted
    return _MISSING, " or ".join(_candidates(paths))


def _split_answer(text: str) -> tuple[str, str]:
    """GSM8K ``reasoning #### answer`` -> (demonstration, ground truth) (module docstring)."""
    if "####" not in text:
        return text, text.strip()
    reasoning, answer = (t.strip() for t in text.rsplit("####", 1))
    if _THOUSANDS.fullmatch(answer):
        answer = answer.replace(",", "")
    return f"{reasoning}\n\n\\boxed{{{answer}}}", answer


def _record(path: Path, where: str, row: Any, layout: Layout, require_target: bool) -> Record:
    """The `Record` of one row; `where` ("line 3", "row 3") names it in errors."""
    def fail(name: str, column: str, problem: str) -> DataError:
        return DataError(f"{path}: {where}: field '{name}' (column '{column}'): {problem}")

    if not isinstance(row, dict):
        raise DataError(f"{path}: {where}: expected a JSON object, got {type(row).__name__}")
    fmap = layout.fields
    values = {name: _lookup(row, fmap[name]) for name in DEFAULT_FIELDS}

    def required(name: str) -> tuple[Any, str]:
        value, column = values[name]
        if value is _MISSING:
            raise fail(name, column, f"missing — the row's columns are {', '.join(map(str, row)) or 'none'}; "
                                     f"name the right one with data.fields.{CONFIG_NAMES[name]}=COLUMN")
        return value, column

    prompt, column = required("prompt")
    messages = _prompt(prompt, lambda problem: fail("prompt", column, problem))

    truth, column = required("ground_truth")
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        truth = str(truth)
    if not isinstance(truth, str) or not truth.strip():
        raise fail("ground_truth", column, f"expected a non-empty string, got {truth!r:.60}")
    if layout.split_answer:
        demonstration, truth = _split_answer(truth)
        if values["target"][1] == column:
            values["target"] = (demonstration, column)

    target, column = required("target") if require_target else values["target"]
    if target is not _MISSING:
        target = _target(target, lambda problem: fail("target", column, problem))

    used = {p.split(".")[0] for paths in fmap.values() for p in _candidates(paths)}
    leftover = {k: v for k, v in row.items() if k not in used}
    optional: dict[str, Any] = {}
    for name, kind, default in (
        ("data_source", str, path.stem),
        ("ability", str, ""),
        ("extra_info", dict, leftover),
    ):
        value, column = values[name]
        if value is _MISSING:
            value = default
        elif not isinstance(value, kind):
            raise fail(name, column, f"expected {kind.__name__}, got {type(value).__name__}")
        optional[name] = value
    return Record(messages, truth, None if target is _MISSING else target, **optional)


def _prompt(value: Any, fail) -> list[dict[str, str]]:
    if isinstance(value, str):
        if not value.strip():
            raise fail("empty prompt")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise fail(f"expected a non-empty string or chat list, got {type(value).__name__} {value!r:.60}")
    messages = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise fail(f"message {i} must be an object with string 'role' and 'content', got {m!r:.60}")
        messages.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in messages):
        raise fail("empty prompt (every message is blank)")
    return messages


def _target(value: Any, fail) -> str:
    if isinstance(value, list):
        if len(value) != 1 or not isinstance(value[0], dict) or value[0].get("role") != "assistant":
            raise fail(f"expected a list with one assistant message, got {value!r:.60}")
        value = value[0].get("content")
    if not isinstance(value, str) or not value.strip():
        raise fail(f"expected a non-empty string, got {value!r:.60}")
    return value
