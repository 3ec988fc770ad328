"""bench/evidence/records.py: a study's finished runs kept in the repository are an --out-dir the analyses read
as they read the runs themselves; unfinished runs are not kept; a finished run lacking a file is refused whole."""

import json

import pytest

from bench.evidence.records import KEPT, keep
from bench.evidence.study_tests import runs


def _run(root, name, stopped_early=False, files=KEPT):
    run = root / "steps-credit" / name
    run.mkdir(parents=True)
    for f in files:
        (run / f).write_text(json.dumps({"stopped_early": stopped_early, "file": f}) + "\n")
    (run / "hf").mkdir()  # the final model: not kept
    return run


def test_finished_runs_are_kept_and_read_back_as_runs(tmp_path):
    src, dest = tmp_path / "out", tmp_path / "records"
    _run(src, "rloo-s0")
    _run(src, "rloo-s1", stopped_early=True)  # stopped by its time limit: not a finished run
    _run(src, "prime-prm2e-4-s0")
    assert keep(src, "steps-credit", dest) == ["prime-prm2e-4-s0", "rloo-s0"]
    kept = dest / "steps-credit" / "rloo-s0"
    assert sorted(p.name for p in kept.iterdir()) == sorted(KEPT)
    assert (kept / "metrics.jsonl").read_text() == (src / "steps-credit" / "rloo-s0" / "metrics.jsonl").read_text()
    assert runs(dest, "steps-credit", "rloo") == {0: kept}  # study_tests reads the records as an --out-dir
    assert not (dest / "steps-credit" / "rloo-s1").exists()


def test_a_finished_run_without_its_per_prompt_file_is_refused_before_any_copy(tmp_path):
    src, dest = tmp_path / "out", tmp_path / "records"
    _run(src, "rloo-s0")
    _run(src, "rloo-s2", files=("summary.json", "metrics.jsonl"))
    with pytest.raises(FileNotFoundError, match="rloo-s2.*eval_prompts.jsonl"):
        keep(src, "steps-credit", dest)
    assert not dest.exists()
