"""A teacher file (`--demos`) that partly matches the training prompts: the start-up line counts and
names its stray rows and the training prompts left without a demonstration (they are not trained), and
a file giving fewer than data.min_demo_match of the training prompts a demonstration is refused before
anything starts, naming the key and the fix."""

import json
from pathlib import Path

import pytest

from configs.schema import RunConfig
from launch.prep.data import load_run_data, match_demos
from launch.prep.preflight import PreflightError, preflight
from tasks.records import Record
from tasks.tiny_model import build_tokenizer

MATH500 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"


def rows(n: int | None = None) -> list[dict]:
    return [json.loads(line) for line in MATH500.read_text().splitlines()[:n]]


def jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def luffy(demos: Path, **data) -> RunConfig:
    return RunConfig(algo="luffy", data={"task": "file", "path": str(MATH500), "demos": str(demos), **data})


@pytest.mark.skipif(not MATH500.is_file(), reason="needs ../shared/data/math500.jsonl")
def test_a_teacher_file_matching_too_little_is_refused(tmp_path):
    # MATH-500: 300 training prompts (rows 1-300), 200 held out; the teacher file covers 100 of them
    strays = [{"problem": f"Stray question {k}?", "answer": "1", "solution": "\\boxed{1}"} for k in range(5)]
    teacher = jsonl(tmp_path / "teacher.jsonl", rows(100) + strays)
    with pytest.raises(PreflightError) as err:
        preflight(luffy(teacher))
    assert str(err.value) == (
        f"data.demos: {teacher}: 100 of the 300 training prompts have a demonstration (33%; 5 of its 105 rows "
        "match no prompt, by question text), below data.min_demo_match=0.5 — give the teacher file of the training "
        "data, or accept the coverage with --set data.min_demo_match=0.33")
    preflight(luffy(teacher, min_demo_match=0.33))  # the fix it names passes
    preflight(luffy(MATH500))  # the file itself: every training prompt matched, held-out rows are no strays


@pytest.mark.skipif(not MATH500.is_file(), reason="needs ../shared/data/math500.jsonl")
def test_the_start_up_line_counts_and_names_the_misses(tmp_path):
    strays = [{"problem": f"Stray question {k}?", "answer": "1", "solution": "\\boxed{1}"} for k in range(4)]
    teacher = jsonl(tmp_path / "teacher.jsonl", rows(500)[2:] + strays)  # no row for prompts 0 and 1
    cfg = luffy(teacher)
    said: list[str] = []
    data = load_run_data(cfg, build_tokenizer(), tmp_path, need_demos=True, reward_fn=lambda *a: 1.0, log=said.append)
    line = next(s for s in said if "have a demonstration" in s)
    assert line.startswith(f"[data] {teacher}: 298 of 300 training prompts have a demonstration (99%; the others are "
                           "not trained) — without: prompt 0 'If $2^8=4^x$, what is the value of $x$?', "
                           "prompt 1 'For what values of $x$ is it true that …'; 4 of 502 teacher rows")
    assert line.endswith("; 4 of 502 teacher rows match no prompt — row 499 'Stray question 0?', row 500 'Stray "
                         "question 1?', row 501 'Stray question 2?'; 200 match held-out prompts (not trained)")
    trained = {it.prompt_index for it in data.train}  # those that fit data.max_prompt_tokens, 0 and 1 not
    assert trained and trained == set(data.demos) - set(data.skipped_prompts) and not trained & {0, 1}


def test_a_question_shared_by_two_prompts_gives_both_the_demonstration():
    def rec(q: str, target: str | None = None) -> Record:
        return Record([{"role": "user", "content": q}], "1", target)

    train = [rec("a"), rec("b"), rec("a")]
    match = match_demos([rec("a", "A"), rec("z", "Z")], train, held_out=[rec("b")])
    assert match.demos == {0: 0, 2: 0} and match.without == [1] and match.strays == [(1, "z")]
    assert match.held_out == 0 and match.problem("t.jsonl", 0.5) is None
    assert match.problem("t.jsonl", 0.9).startswith("data.demos: t.jsonl: 2 of the 3 training prompts have a ")
