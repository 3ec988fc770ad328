"""Data as users have it: a `.json` file holding an array of rows loads as its `.jsonl` twin does, and a Hub
dataset (`hf://NAME[:CONFIG]`) loads through `datasets.load_dataset` with `data.split` / `data.eval_split`,
or is refused before start naming `pip install datasets` when that package is missing."""

import importlib.util
import json
from pathlib import Path

import pytest

from configs.schema import RunConfig
from launch.prep.data import load_prompt_records
from launch.prep.preflight import PreflightError, preflight
from launch.state.storage import absolutize
from tasks.loaders import load_dataset
from tasks.records import DataError

MATH500 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"
HAVE_DATASETS = importlib.util.find_spec("datasets") is not None


def rows(n: int = 6) -> list[dict]:
    return [json.loads(line) for line in MATH500.read_text().splitlines()[:n]]


def test_a_json_array_loads_like_jsonl(tmp_path):
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "json").mkdir()
    as_lines = tmp_path / "jsonl" / "math.jsonl"
    as_lines.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    as_array = tmp_path / "json" / "math.json"
    as_array.write_text(json.dumps(rows(), indent=2))
    lines_records, lines_layout = load_dataset(as_lines)
    array_records, array_layout = load_dataset(as_array)
    assert array_records == lines_records and len(array_records) == 6
    assert array_layout == lines_layout and array_layout.name == "problem/answer/solution"
    # a run reads it as data.path (held-out split from its last rows), as it reads the .jsonl
    cfg = RunConfig(data={"task": "file", "path": str(as_array), "eval_prompts": 2})
    train, held_out = load_prompt_records(cfg)
    assert [r.question for r in train + held_out] == [r["problem"] for r in rows()]


def test_json_lines_under_a_json_name_load_and_errors_name_the_row(tmp_path):
    lines = tmp_path / "d.json"  # what `datasets`' to_json writes: one object per line
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows(2)))
    assert [r.ground_truth for r in load_dataset(lines)[0]] == [r["answer"] for r in rows(2)]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"prompt": "1+1?", "answer": "2"}, {"prompt": "", "answer": "3"}]))
    with pytest.raises(DataError, match=r"bad.json: row 2: field 'prompt' \(column 'prompt'\): empty prompt"):
        load_dataset(bad)
    obj = tmp_path / "obj.json"
    obj.write_text(json.dumps({"rows": rows(2)}))
    with pytest.raises(DataError, match=r"obj.json: expected a JSON array of rows \(or one object per line\), got an "
                                         r"object — put the rows in a top-level \[...\] array"):
        load_dataset(obj)


def test_a_hub_dataset_stays_a_name_through_absolutize(tmp_path):
    cfg = RunConfig(data={"task": "file", "path": "hf://openai/gsm8k:main", "eval_path": "hf://openai/gsm8k:main"})
    out = absolutize(cfg, tmp_path)
    assert (out.data.path, out.data.eval_path) == ("hf://openai/gsm8k:main", "hf://openai/gsm8k:main")


@pytest.mark.skipif(HAVE_DATASETS, reason="checks the refusal when the `datasets` package is missing")
def test_without_datasets_a_hub_dataset_is_refused_naming_the_install():
    cfg = RunConfig(data={"task": "file", "path": "hf://openai/gsm8k:main"})
    with pytest.raises(PreflightError) as err:
        preflight(cfg)
    assert str(err.value) == ("data.path: hf://openai/gsm8k:main is a Hub dataset, read with the `datasets` package, "
                              "which is not installed — `pip install datasets`, or save the data as a .jsonl file")
    with pytest.raises(DataError, match=r"hf://openai/gsm8k:main: Hub datasets are read with the `datasets` package, "
                                        r"which is not installed — `pip install datasets`"):
        load_dataset("hf://openai/gsm8k:main")


@pytest.mark.skipif(not HAVE_DATASETS, reason="the optional `datasets` package is not installed here (pip install "
                                              "datasets); its absence is tested above")
def test_a_hub_dataset_loads_its_splits_through_datasets(monkeypatch):
    import datasets

    gsm8k = {  # GSM8K's layout: question, answer "reasoning #### final"
        "train": [{"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1} #### {i + 1}"} for i in range(5)],
        "test": [{"question": "What is 9+9?", "answer": "9+9=18 #### 18"}],
    }
    asked = []

    def from_the_hub(name, config=None, split=None):  # what the Hub would serve (nothing here reaches it)
        asked.append((name, config, split))
        return datasets.Dataset.from_list(gsm8k[split])

    monkeypatch.setattr(datasets, "load_dataset", from_the_hub)
    cfg = RunConfig(data={"task": "file", "path": "hf://openai/gsm8k:main", "eval_path": "hf://openai/gsm8k:main"})
    train, held_out = load_prompt_records(cfg)
    assert asked == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert [r.ground_truth for r in train] == ["1", "2", "3", "4", "5"] and held_out[0].ground_truth == "18"
    assert train[0].data_source == "openai/gsm8k"  # the dataset's name, as a file's stem would be
    preflight(cfg)  # the package is there: nothing to refuse
