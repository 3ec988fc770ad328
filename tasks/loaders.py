"""Loaders for dataset and teacher files in the common layouts: ``.jsonl``, ``.json`` (a JSON array of
rows, or JSON lines as `datasets`' ``to_json`` writes them), ``.parquet``, or ``hf://NAME[:CONFIG]``, one
split of a Hub dataset read with the optional `datasets` package (``datasets.load_dataset(NAME, CONFIG,
split=...)``: from its cache when there, else downloaded by it).

Why strict: a malformed row found mid-run would crash an actor hours in, or silently train on garbage.
`load_records` validates every row up front and either returns all of them or raises one `DataError`
naming the file, the line (JSON lines) or row (a JSON array, parquet, a Hub split; 1-based) and the field.
Nothing is half-loaded.

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
``data_source`` (default: the file's stem, or a Hub dataset's NAME), ``ability`` (default ""), ``extra_info`` (default: the
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
HUB_DATA = "hf://"  # prefix of a Hub dataset where a file path is expected
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
                 require_target: bool = False, split: str = "train") -> tuple[list[Record], Layout]:
    """All rows of a data file (or of split `split` of a Hub dataset, ``hf://NAME[:CONFIG]``) as `Record`s
    and the layout read, or a `DataError`."""
    if str(path).startswith(HUB_DATA):
        name = str(path)[len(HUB_DATA):].partition(":")[0]
        rows, unit = _hub_rows(str(path), split), "row"
    else:
        path = Path(path)
        name = path.stem
        rows, unit = _read_rows(path)
    layout = detect_layout(rows[0][1] if rows else {}, fields)
    return [_record(path, name, f"{unit} {n}", row, layout, require_target) for n, row in rows], layout


def load_records(path: str | Path, fields: Mapping[str, Columns] | None = None, *,
                 require_target: bool = False, split: str = "train") -> list[Record]:
    """`load_dataset` without the layout."""
    return load_dataset(path, fields, require_target=require_target, split=split)[0]


def _json_lines(path: Path, text: str) -> list[tuple[int, Any]]:
    """(line number, row) of one JSON object per line; blank lines are skipped."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {n}: invalid JSON: {e}") from e
    return rows


def _read_rows(path: Path) -> tuple[list[tuple[int, Any]], str]:
    """(row number, raw row) pairs and what a number counts ("line" or "row")."""
    if path.suffix in (".jsonl", ".json"):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: cannot read file: {e}") from e
        if path.suffix == ".jsonl":
            return _json_lines(path, text), "line"
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":  # more than one value: JSON lines under a .json name
                return _json_lines(path, text), "line"
            raise DataError(f"{path}: invalid JSON: {e}") from e
        if not isinstance(whole, list):
            kind = "an object" if isinstance(whole, dict) else type(whole).__name__
            raise DataError(f"{path}: expected a JSON array of rows (or one object per line), got {kind} — put "
                            "the rows in a top-level [...] array")
        return list(enumerate(whole, 1)), "row"
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: cannot read parquet file: {e}") from e
        return list(enumerate(table.to_pylist(), 1)), "row"
    raise DataError(f"{path}: unknown format (expected .jsonl, .json or .parquet, or {HUB_DATA}NAME[:CONFIG] for a "
                    "Hub dataset)")


def _hub_rows(source: str, split: str) -> list[tuple[int, Any]]:
    """(row number, row) of split `split` of the Hub dataset `source` = hf://NAME[:CONFIG]."""
    name, _, config = source[len(HUB_DATA):].partition(":")
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source}: Hub datasets are read with the `datasets` package, which is not installed — "
                        "`pip install datasets`, or save the data as a .jsonl/.parquet file") from None
    try:
        table = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # unknown name, config or split; offline without a cached copy
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise DataError(f"{source}: split {split!r} does not load ({type(e).__name__}: {why}) — check NAME, the "
                        "CONFIG after ':' and data.split / data.eval_split, and that the Hub is reachable or the "
                        "dataset is in the `datasets` cache") from None
    return list(enumerate(table.to_list(), 1))


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


def _record(path: str | Path, source: str, where: str, row: Any, layout: Layout, require_target: bool) -> Record:
    """The `Record` of one row of `path` (`source`: its default data_source); `where` ("line 3", "row 3")
    names it in errors."""
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
        ("data_source", str, source),
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
