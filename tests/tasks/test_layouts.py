"""Data layouts recognised from a file's columns, and `data.fields` overriding them."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs.schema import RunConfig
from launch.prep.data import read_file
from tasks.loaders import detect_layout, load_dataset
from tasks.records import DataError, Record

MATH500 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"

# A GSM8K-style row (written here): reasoning with calculator notes, then "####" and the final answer.
GSM8K_ROW = {"question": "Ana has 3 boxes of 400 pens and sells 150. How many pens are left?",
             "answer": "She had 3*400 = <<3*400=1200>>1200 pens.\nShe has 1200-150 = <<1200-150=1050>>1050 left.\n"
                       "#### 1,050"}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_math500_as_shipped_is_problem_answer_solution():
    records, layout = load_dataset(MATH500, require_target=True)
    assert len(records) == 500
    assert layout.describe() == ("problem/answer/solution (prompt <- problem, answer <- answer, "
                                 "solution <- solution)")
    assert records[1].question.startswith("For what values of $x$ is it true that $x^2 - 5x - 4 \\le 10$?")
    assert records[1].ground_truth == "[-2,7]"
    assert records[1].target.endswith("$\\boxed{x \\in [-2,7]}$.")
    assert records[1].extra_info == {"id": "test/algebra/6.json", "level": "Level 4", "type": "Algebra"}


def test_verl_parquet(tmp_path):
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "system", "content": "Box it."},
                                                      {"role": "user", "content": "1+2?"}],
           "ability": "math", "reward_model": {"style": "rule", "ground_truth": "3"},
           "extra_info": {"split": "train", "index": 7}}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "train.parquet")
    records, layout = load_dataset(tmp_path / "train.parquet")
    assert layout.describe() == ("veRL (prompt <- prompt, answer <- reward_model.ground_truth or answer, "
                                 "solution <- target)")
    assert records == [Record(row["prompt"], "3", None, "openai/gsm8k", "math", {"split": "train", "index": 7})]


def test_gsm8k_answer_is_split_at_the_last_hashes(tmp_path):
    records, layout = load_dataset(_jsonl(tmp_path / "gsm.jsonl", [GSM8K_ROW, {"question": "Q", "answer": "12"}]),
                                   require_target=True)
    assert layout.name == "question/answer (GSM8K)" and "answer after the last ####" in layout.describe()
    first, second = records
    assert first.question == GSM8K_ROW["question"]
    assert first.ground_truth == "1050"  # "1,050": the thousands separator is dropped
    assert first.target == ("She had 3*400 = <<3*400=1200>>1200 pens.\nShe has 1200-150 = <<1200-150=1050>>1050 "
                            "left.\n\n\\boxed{1050}")
    assert (second.ground_truth, second.target) == ("12", "12")  # no "####": the answer as is


def test_fields_override_the_recognised_columns(tmp_path):
    rows = [{"instruction": "Name 6*7.", "final": {"value": 42}, "worked": "6*7 = \\boxed{42}"}]
    path = _jsonl(tmp_path / "custom.jsonl", rows)
    cfg = RunConfig(data={"fields": {"prompt": "instruction", "answer": "final.value", "solution": "worked"}})
    said = []
    records = read_file(cfg, path, require_target=True, log=said.append)
    assert records == [Record([{"role": "user", "content": "Name 6*7."}], "42", "6*7 = \\boxed{42}", "custom", "", {})]
    assert said == [f"[data] {path}: 1 rows, layout veRL with data.fields prompt=instruction, answer=final.value, "
                    "solution=worked (prompt <- instruction, answer <- final.value, solution <- worked)"]


def test_overriding_the_gsm8k_answer_column_stops_the_split():
    layout = detect_layout(GSM8K_ROW, {"ground_truth": "final"})
    assert layout.fields["prompt"] == "question" and not layout.split_answer


def test_a_missing_column_names_the_row_columns_and_the_fields_key(tmp_path):
    path = _jsonl(tmp_path / "odd.jsonl", [{"query": "Q", "label": "1"}])
    with pytest.raises(DataError) as err:
        load_dataset(path)
    assert str(err.value) == (f"{path}: line 1: field 'prompt' (column 'prompt'): missing — the row's columns are "
                              "query, label; name the right one with data.fields.prompt=COLUMN")
    cfg = RunConfig(data={"fields": {"prompt": "query", "answer": "label"}})
    assert read_file(cfg, path)[0].ground_truth == "1"
