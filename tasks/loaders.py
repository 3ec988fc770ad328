"""Loaders for veRL-style parquet and JSONL datasets and teacher files.

Why strict: a malformed row found mid-run would crash an actor hours in, or silently train on garbage.
`load_records` validates every row up front and either returns all of them or raises one `DataError`
naming the file, the row (1-based; in JSONL the line number) and the field. Nothing is half-loaded.

Fields (ours <- default column, dotted paths reach into nested objects):

* ``prompt`` <- ``prompt``: a non-empty string or a chat list of ``{role, content}`` strings;
* ``ground_truth`` <- ``reward_model.ground_truth``, else a top-level ``answer``: a non-empty string
  (numbers are turned into strings);
* ``target`` <- ``target``: a non-empty string or a list with one assistant message; optional unless
  ``require_target=True`` (LUFFY teacher files);
* ``data_source`` (default: the file's stem), ``ability`` (default ""), ``extra_info`` (default: the
  row's columns that no field uses, e.g. math500's ``id``, ``level``, ``type``).

`fields` overrides the mapping, e.g. `MATH500_FIELDS` reads /work/shared/data/math500.jsonl as
prompt=problem, target=solution, ground_truth=answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.records import DataError, Record

DEFAULT_FIELDS: dict[str, str | tuple[str, ...]] = {
    "prompt": "prompt",
    "ground_truth": ("reward_model.ground_truth", "answer"),
    "target": "target",
    "data_source": "data_source",
    "ability": "ability",
    "extra_info": "extra_info",
}
MATH500_FIELDS: dict[str, str] = {"prompt": "problem", "target": "solution", "ground_truth": "answer"}

_MISSING = object()


def load_records(
    path: str | Path,
    fields: Mapping[str, str | tuple[str, ...]] | None = None,
    *,
    require_target: bool = False,
) -> list[Record]:
    """All rows of a ``.jsonl`` or ``.parquet`` file as `Record`s, or a `DataError` (see module doc)."""
    path = Path(path)
    unknown = set(fields or {}) - set(DEFAULT_FIELDS)
    if unknown:
        raise ValueError(f"unknown field names {sorted(unknown)}; known: {sorted(DEFAULT_FIELDS)}")
    fmap = {**DEFAULT_FIELDS, **(fields or {})}
    return [_record(path, n, row, fmap, require_target) for n, row in _read_rows(path)]


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
                raise DataError(f"{path}: row {n}: invalid JSON: {e}") from e
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


def _candidates(paths: str | tuple[str, ...]) -> tuple[str, ...]:
    return (paths,) if isinstance(paths, str) else paths


def _lookup(row: dict, paths: str | tuple[str, ...]) -> tuple[Any, str]:
    """The first present, non-null value among the dotted `paths`, and the path it came from."""
    for dotted in _candidates(paths):
        value: Any = row
        for key in dotted.split("."):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING and value is not None:
            return value, dotted
    return _MISSING, " or ".join(_candidates(paths))


def _record(path: Path, n: int, row: Any, fmap: dict, require_target: bool) -> Record:
    def fail(name: str, column: str, problem: str) -> DataError:
        return DataError(f"{path}: row {n}: field '{name}' (column '{column}'): {problem}")

    if not isinstance(row, dict):
        raise DataError(f"{path}: row {n}: expected a JSON object, got {type(row).__name__}")
    values = {name: _lookup(row, fmap[name]) for name in DEFAULT_FIELDS}

    def required(name: str) -> tuple[Any, str]:
        value, column = values[name]
        if value is _MISSING:
            raise fail(name, column, "missing")
        return value, column

    prompt, column = required("prompt")
    messages = _prompt(prompt, lambda problem: fail("prompt", column, problem))

    truth, column = required("ground_truth")
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        truth = str(truth)
    if not isinstance(truth, str) or not truth.strip():
        raise fail("ground_truth", column, f"expected a non-empty string, got {truth!r:.60}")

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
