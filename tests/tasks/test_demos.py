"""Noisy demonstrations and LUFFY teacher files (written, then read back with the loaders)."""

import pytest

from tasks.arithmetic import make_splits
from tasks.demos import demonstration_records, problem_records, write_teacher_file
from tasks.loaders import load_records
from tasks.outcome import reward
from tasks.step_checker import score_steps, split_steps

TRAIN, _ = make_splits(400, 10, seed=0)


def test_error_rate_and_corrupted_flag():
    records = demonstration_records(TRAIN, error_rate=0.25, seed=1)
    corrupted = [r.extra_info["corrupted"] for r in records]
    # 400 draws at p = 0.25: mean 100, sd ~8.7; 60..140 is more than 4.5 sd either side
    assert 60 < sum(corrupted) < 140
    for r, problem in zip(records, TRAIN):
        assert r.ground_truth == problem.answer and r.question == problem.prompt
        # a corrupted demonstration has a wrong answer and at least one step the checker rejects
        assert reward(r.target, r.ground_truth) == (0.0 if r.extra_info["corrupted"] else 1.0)
        steps = score_steps(problem, r.target, split_steps(r.target))
        assert (-1.0 in steps) == r.extra_info["corrupted"]


def test_deterministic_and_bounded():
    assert demonstration_records(TRAIN[:50], seed=2) == demonstration_records(TRAIN[:50], seed=2)
    assert all(not r.extra_info["corrupted"] for r in demonstration_records(TRAIN[:50], error_rate=0.0))
    assert all(r.extra_info["corrupted"] for r in demonstration_records(TRAIN[:50], error_rate=1.0))
    with pytest.raises(ValueError, match="error_rate"):
        demonstration_records(TRAIN[:5], error_rate=1.5)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_teacher_file_round_trip(tmp_path, suffix):
    path = write_teacher_file(tmp_path / f"teacher{suffix}", TRAIN[:30], error_rate=0.3, seed=5)
    loaded = load_records(path, require_target=True)
    assert loaded == demonstration_records(TRAIN[:30], error_rate=0.3, seed=5)
    assert loaded[0].prompt == [{"role": "user", "content": TRAIN[0].prompt}]
    assert loaded[0].data_source == "synthetic_arithmetic"


def test_prompt_records_have_no_target(tmp_path):
    path = write_teacher_file(tmp_path / "t.parquet", TRAIN[:3])
    records = problem_records(TRAIN[:3], split="train")
    assert all(r.target is None for r in records)
    assert [r.ground_truth for r in records] == [r.ground_truth for r in load_records(path)]
