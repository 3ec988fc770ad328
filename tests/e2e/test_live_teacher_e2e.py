"""End to end: LUFFY guided by a live teacher (`teacher.live_traces=missing`, no teacher file): the teacher's own
vLLM engine writes a trace per training prompt while a real actor and learner rank (under Ray: the kept traces reach the actor's process as they would on a
cluster) and a real buffer train, the
run's reward keeps some and rejects others (`field_rewards.odd_length`: 1 for an odd number of characters in
response and ground truth, so the test recomputes which), the kept ones reach LUFFY's demonstration rows and are appended to
teacher_traces.jsonl. (That a second run reads the file back as `--demos`, and a resumed one as its own: tests/launch/
test_teacher_traces.py.) The
untrained tiny model is both student and teacher (the plumbing is under test, not learning)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.tiny_model import build_tiny_model
from tests.e2e.helpers import UNTRAINED, assert_keys_documented, train, trained_rows

pytestmark = pytest.mark.slow

REWARD = f"reward.fn={Path(__file__).with_name('field_rewards.py')}:odd_length"
FEW = ["--algo", "luffy", "--actors", "1", "--max-staleness", "1", "--set", "data.train_prompts=12",
       "--set", "rollout.max_response_tokens=16", "--set", "learner.eval_every=0", "--set", REWARD, *UNTRAINED]


def test_a_live_teachers_traces_are_trained_and_written(tmp_path, model_cache):
    run = tmp_path / "live"
    teacher = build_tiny_model(tmp_path / "teacher")  # the untrained built-in model, as the student is
    train(run, model_cache, *FEW, "--steps", "12", "--set", "teacher.live_traces=missing",
          "--set", f"teacher.path={teacher}")
    lines = [json.loads(s) for s in (run / "teacher_traces.jsonl").read_text().splitlines()]
    last = trained_rows(run)[-1]
    assert lines and last["demos/from_teacher"] == len(lines) and last["demos/from_file"] == 0
    kept = [len(x["target"][0]["content"]) + len(x["reward_model"]["ground_truth"]) for x in lines]
    assert all(k % 2 == 1 for k in kept), kept  # only traces the reward kept
    assert last["demos/from_teacher"] + last["demos/rejected"] + last["demos/teacher_pending"] <= 12
    assert any(r["luffy/offpolicy_row_frac"] > 0 for r in trained_rows(run)), "no teacher row was trained"
    assert_keys_documented(run)
