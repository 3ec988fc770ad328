"""A live teacher's engine that dies mid-run (`launch.processes.teacher_role.LiveTeacher`) is replaced, like an
actor's, and the prompts it had not finished are re-queued: every queued prompt ends with exactly one trace,
kept or rejected, and the trace file holds each kept one once. A real vLLM engine on the built-in tiny model,
shut down under the teacher while its requests run: they never answer, so the batch deadline
(rollout.deadlines.group_s, 10 s here) is what sees it."""

import json
import time

import pytest

from actors.engine import shutdown_engine
from configs.schema import RunConfig
from launch.prep.data import load_run_data
from launch.prep.teacher_traces import TRACE_FILE
from launch.processes.teacher_role import LiveTeacher
from tasks.tiny_model import build_tiny_model, build_tokenizer

pytestmark = pytest.mark.slow


def test_a_dead_teacher_engine_is_replaced_and_nothing_is_lost(tmp_path):
    teacher_dir = build_tiny_model(tmp_path / "teacher")
    cfg = RunConfig.model_validate({
        "algo": "luffy", "teacher": {"path": str(teacher_dir), "live_traces": "missing"},
        "data": {"train_prompts": 48}, "rollout": {"max_response_tokens": 32, "deadlines": {"group_s": 10}}, "weight_sync": {"backend": "gloo"}})
    data = load_run_data(cfg, build_tokenizer(), tmp_path, need_demos=True, reward_fn=lambda *a: 1.0, log=print)
    assert not data.demos and len(data.train) == 48  # no file: every prompt waits for the teacher
    said: list[str] = []
    keep_odd = lambda q, text, gt, extra: float(len(text) % 2 == 1)  # noqa: E731 — some kept, some rejected
    teacher = LiveTeacher(cfg, teacher_dir, data, tmp_path, log=said.append, reward_fn=keep_odd)
    teacher.start()
    deadline = time.monotonic() + 300
    while teacher.counts.from_teacher + teacher.counts.rejected < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    host = teacher.engine.host
    assert host is not None and host.engine is not None, said

    async def kill():
        shutdown_engine(host.engine)

    host.call(kill(), timeout_s=60)  # the engine dies under the teacher's requests in flight
    teacher._thread.join(300)
    assert not teacher._thread.is_alive(), said
    c = teacher.counts
    assert teacher.restarts == 1 and any("the teacher's engine died" in s for s in said), said
    assert c.from_teacher + c.rejected == 48 and not teacher.todo, (c, said)  # every prompt once: nothing lost
    kept = teacher.take()
    lines = [json.loads(s) for s in (tmp_path / TRACE_FILE).read_text().splitlines()]
    assert len(lines) == len(kept) == c.from_teacher > 0
    questions = [x["prompt"][0]["content"] for x in lines]
    assert len(set(questions)) == len(questions)  # no prompt traced twice
