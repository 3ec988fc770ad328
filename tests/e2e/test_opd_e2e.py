"""End to end: `algo-train --algo opd` distills from a teacher with a real vLLM actor, a real buffer process and
a real learner rank, under Ray (the rows the teacher's engine scored in the driver travel to the learner rank as
they would on a cluster). Student and
teacher are given as a user of the field gives them: Hub ids found in the local HF cache (`tests.hub_cache`):
the untrained tiny model as the student, another initialisation of it (other weights, the same tokenizer) as
the teacher, so the reverse KL is far from 0 and must be logged every step. The teacher scores on its own vLLM
engine (`teacher.scoring=engine`: the driver's `launch.processes.teacher_scorer`, the rows' scores read by the
learner, which never loads it); the learner-side teacher is tests/learner/test_teacher.py's, and the two give
the same numbers (tests/learner/test_teacher_engine.py). Learning itself is measured on the quick-start
(bench/opd_quickstart.md)."""

from __future__ import annotations

import math
import os
import subprocess

import pytest
import yaml

from tasks.tiny_model import build_tiny_model
from tests.e2e.helpers import (
    UNTRAINED,
    assert_keys_documented,
    assert_weights_changed_from,
    check_run,
    command,
)
from tests.hub_cache import hub_cache

pytestmark = pytest.mark.slow


def test_opd_distills_from_a_cached_hub_teacher(tmp_path):
    out, hub = tmp_path / "opd", tmp_path / "hf-hub"
    student = hub_cache(hub, "org/tiny", build_tiny_model(tmp_path / "tiny"))
    teacher = hub_cache(hub, "org/teacher", build_tiny_model(tmp_path / "teacher", seed=1))
    cmd = command(out, None, "--algo", "opd", "--actors", "1", "--steps", "3", "--max-staleness", "1",
                  "--model", "org/tiny", "--set", "teacher.path=org/teacher", "--set", "teacher.scoring=engine",
                  *UNTRAINED)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_CACHE=str(hub)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = check_run(out, 3, 1, "opd/reverse_kl")
    assert all(math.isfinite(r["opd/reverse_kl"]) and r["opd/kl_adv"] > 0.01 for r in rows), rows
    assert all(r["time/teacher_score_s"] > 0 and r["teacher/engine_restarts"] == 0 for r in rows), rows
    assert "[teacher] scoring on its own vLLM engine (teacher.scoring=engine)" in proc.stdout + proc.stderr
    assert_keys_documented(out)
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["teacher"]["path"] == str(teacher)  # the Hub id became its cached snapshot, as model.path does
    assert_weights_changed_from(student, out, 3)
