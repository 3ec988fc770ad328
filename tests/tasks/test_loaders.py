"""Loaders: real data (math500 as JSONL and as veRL parquet) and every kind of bad row."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.loaders import MATH500_FIELDS, load_records
from tasks.records import DataError, Record, write_records

MATH500 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"


def test_math500_jsonl_with_field_map():
    records = load_records(MATH500, MATH500_FIELDS)
    assert len(records) == 500
    first = records[0]
    assert first.prompt == [{"role": "user", "content": "If $2^8=4^x$, what is the value of $x$?"}]
    assert first.ground_truth == "4"
    assert first.target.endswith("$x=\\boxed{4}$.")
    assert first.data_source == "math500"  # the file's stem
    assert first.extra_info == {"id": "test/algebra/4.json", "level": "Level 1", "type": "Algebra"}


def test_math500_as_verl_parquet(tmp_path):
    # The veRL layout LUFFY reads: prompt as a chat list, reward_model.ground_truth, target as a list
    # with one assistant message. Written with pyarrow directly, not with our writer.
    rows = [json.loads(line) for line in MATH500.read_text().splitlines()[:50]]
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "MATH-500",
                "prompt": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": r["problem"]},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": r["answer"]},
                "extra_info": {"split": "test", "index": i},
                "target": [{"role": "assistant", "content": r["solution"]}],
            }
            for i, r in enumerate(rows)
        ]
    )
    pq.write_table(table, tmp_path / "math500.parquet")
    records = load_records(tmp_path / "math500.parquet", require_target=True)
    assert [r.ground_truth for r in records] == [r["answer"] for r in rows]
    assert [r.target for r in records] == [r["solution"] for r in rows]
    assert records[3].question == rows[3]["problem"] and records[3].prompt[0]["role"] == "system"
    assert records[3].extra_info == {"split": "test", "index": 3} and records[3].ability == "math"
    # and our writer produces the same layout
    write_records(tmp_path / "again.parquet", records)
    assert load_records(tmp_path / "again.parquet") == records


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"prompt": "What is 1+1?", "reward_model": {"ground_truth": "2"}}


def test_plain_forms_are_accepted(tmp_path):
    rows = [
        GOOD,
        "",  # blank lines are skipped, but still counted for row numbers
        {
            "prompt": [{"role": "user", "content": "Q"}],
            "answer": 3,
            "target": "A",
        },  # top-level answer, number
        {
            "prompt": "Q",
            "reward_model": {"ground_truth": "x"},
            "target": [{"role": "assistant", "content": "A"}],
        },
    ]
    records = load_records(_write_jsonl(tmp_path / "ok.jsonl", rows))
    assert records == [
        Record([{"role": "user", "content": "What is 1+1?"}], "2", data_source="ok"),
        Record([{"role": "user", "content": "Q"}], "3", "A", data_source="ok"),
        Record([{"role": "user", "content": "Q"}], "x", "A", data_source="ok"),
    ]


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({"reward_model": {"ground_truth": "2"}}, "line 3: field 'prompt' (column 'prompt'): missing"),
        ({"prompt": "   ", "answer": "2"}, "line 3: field 'prompt' (column 'prompt'): empty prompt"),
        (
            {"prompt": 7, "answer": "2"},
            "line 3: field 'prompt' (column 'prompt'): expected a non-empty string",
        ),
        ({"prompt": [{"role": "user"}], "answer": "2"}, "line 3: field 'prompt' (column 'prompt'): message 0"),
        (
            {"prompt": "Q"},
            "line 3: field 'ground_truth' (column 'reward_model.ground_truth or answer'): missing",
        ),
        ({"prompt": "Q", "reward_model": {"ground_truth": ["2"]}}, "line 3: field 'ground_truth'"),
        (
            {"prompt": "Q", "answer": "2", "target": [{"role": "user", "content": "A"}]},
            "line 3: field 'target'",
        ),
        (
            {"prompt": "Q", "answer": "2", "target": ""},
            "line 3: field 'target' (column 'target'): expected a non-empty",
        ),
        (
            {"prompt": "Q", "answer": "2", "data_source": 5},
            "line 3: field 'data_source' (column 'data_source')",
        ),
        (
            {"prompt": "Q", "answer": "2", "extra_info": "x"},
            "line 3: field 'extra_info' (column 'extra_info')",
        ),
        ('{"prompt": "Q", ', "line 3: invalid JSON"),
        ("[1, 2]", "line 3: expected a JSON object, got list"),
    ],
)
def test_bad_row_names_file_line_and_field(tmp_path, bad_row, message):
    path = _write_jsonl(tmp_path / "data.jsonl", [GOOD, GOOD, bad_row, GOOD])
    with pytest.raises(DataError) as err:
        load_records(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_missing_target_only_when_required(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", [GOOD])
    assert load_records(path)[0].target is None
    with pytest.raises(DataError, match=r"line 1: field 'target' \(column 'target'\): missing"):
        load_records(path, require_target=True)


def test_bad_parquet_row_is_named(tmp_path):
    rows = [{"prompt": "Q", "answer": "1"}, {"prompt": "", "answer": "2"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    with pytest.raises(
        DataError, match=r"d.parquet: row 2: field 'prompt' \(column 'prompt'\): empty prompt"
    ):
        load_records(tmp_path / "d.parquet")


def test_unreadable_files(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: cannot read file"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="junk.parquet: cannot read parquet file"):
        load_records(tmp_path / "junk.parquet")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataError, match="bin.jsonl: cannot read file"):
        load_records(tmp_path / "bin.jsonl")
    with pytest.raises(DataError, match="unknown format"):
        load_records(tmp_path / "data.csv")


def test_unknown_field_name_in_map():
    with pytest.raises(ValueError, match="unknown field names \\['question'\\]"):
        load_records(MATH500, {"question": "problem"})
