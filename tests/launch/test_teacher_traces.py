"""LUFFY with a live teacher (`teacher.live_traces`), the pieces around the engine: the key is refused before
start without LUFFY or a teacher, and a teacher that cannot load is refused by preflight; a trace is kept only
when the run's reward scores it ≥ 1 and counted either way; kept traces appended to the run folder's trace file
read back through `data.demos`' own loader and match their prompts; a trace file that cannot be written is said
in one line, once, and the run goes on (`launch.prep.teacher_traces`)."""

import pytest
from pydantic import ValidationError

from configs.schema import RunConfig
from launch.prep.data import load_prompt_records, match_demos, read_file, tokenize_demos
from launch.prep.preflight import PreflightError, preflight
from launch.prep.teacher_traces import TRACE_FILE, TraceCounts, TraceFile, accepted, trace_record
from tasks.tiny_model import build_tokenizer
from tests.launch.test_teacher_preflight import teacher_dir


def refusal(**cfg) -> str:
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate(cfg)
    return str(err.value)


def test_live_traces_need_luffy_and_a_teacher():
    why = refusal(algo="grpo", teacher={"path": "/t", "live_traces": "missing"})
    assert ("teacher.live_traces: missing asks the teacher for LUFFY's traces but --algo grpo reads none — set "
            "teacher.live_traces=off, or use --algo luffy") in why
    why = refusal(algo="luffy", teacher={"live_traces": "all"})
    assert "teacher.live_traces: all needs a teacher to write the traces and teacher.path is unset — set teacher.path" in why
    assert RunConfig(algo="luffy").teacher.live_traces == "off"  # off by default: file traces only
    RunConfig.model_validate({"algo": "luffy", "teacher": {"path": "/t", "live_traces": "missing"}})


def test_a_live_teacher_that_cannot_load_is_refused_before_start(tmp_path):
    live = {"algo": "luffy", "teacher": {"path": str(tmp_path / "absent"), "live_traces": "missing"}}
    with pytest.raises(PreflightError) as err:
        preflight(RunConfig.model_validate(live))
    assert str(err.value).startswith("teacher.path") and "\n" not in str(err.value)
    live["teacher"]["path"] = str(teacher_dir(tmp_path / "t"))  # the built-in model's tokenizer: the student's
    assert preflight(RunConfig.model_validate(live)) is None


def test_only_correct_traces_are_kept_and_all_are_counted():
    counts = TraceCounts(from_file=7)
    kept = [counts.count(r, t) for r, t in ((1.0, "a"), (0.0, "b"), (0.5, "c"), (1.0, "d"), (1.0, " \n"))]
    assert kept == [True, False, False, True, False]  # the last: correct by the reward but empty (an eos at once)
    assert accepted(1.0, "x") and not accepted(0.999, "x") and not accepted(1.0, "")
    assert counts.metrics() == {"demos/from_file": 7, "demos/from_teacher": 2, "demos/rejected": 3}


def test_appended_traces_read_back_as_demos(tmp_path):
    cfg = RunConfig(algo="luffy")  # the arithmetic task: its training records are the prompts traces are written for
    train, held_out = load_prompt_records(cfg)
    said: list[str] = []
    traces = TraceFile(tmp_path / TRACE_FILE, log=said.append)
    for i in (3, 0, 5):
        assert traces.append(trace_record(train[i], f"trace {i}: {train[i].ground_truth}"))
    assert traces.written == 3 and not said
    back = read_file(cfg, traces.path, require_target=True)  # what a second run's --demos reads
    assert [r.target for r in back] == [f"trace {i}: {train[i].ground_truth}" for i in (3, 0, 5)]
    match = match_demos(back, train, held_out)
    assert match.demos == {3: 0, 0: 1, 5: 2} and not match.strays
    tok = build_tokenizer()
    ids = tokenize_demos(back, train, tok, traces.path, match)
    assert tok.decode(ids[5][:-1]).replace(" ", "") == f"trace5:{train[5].ground_truth}"
    assert ids[5][-1] == tok.eos_token_id


def test_an_unwritable_trace_file_is_said_once_and_the_run_goes_on(tmp_path):
    (tmp_path / TRACE_FILE).mkdir()  # a directory where the file should be: every open fails
    cfg = RunConfig(algo="luffy")
    train, _ = load_prompt_records(cfg)
    said: list[str] = []
    traces = TraceFile(tmp_path / TRACE_FILE, log=said.append)
    assert not traces.append(trace_record(train[0], "x")) and not traces.append(trace_record(train[1], "y"))
    assert len(said) == 1 and said[0].startswith(f"[teacher] cannot write the trace file {tmp_path / TRACE_FILE} (")
    assert "still trained on in this run but not saved from now on (0 saved)" in said[0]


@pytest.mark.parametrize("mode", ["missing", "all"])
def test_a_resumed_run_reads_its_own_traces_and_never_asks_for_them_again(tmp_path, mode):
    """A run stopped after its live teacher kept traces for prompts 3, 0 and 5 is resumed in the same folder: the
    traces come back as demonstrations (from its own trace file, scored by the run's reward like a file's), the
    teacher queues every other prompt and none of those three (with `all` too: they are the teacher's already),
    and the counters go on from 3 kept."""
    from launch.prep.data import load_run_data
    from launch.processes.teacher_role import LiveTeacher
    from tasks.tiny_model import build_tiny_model

    cfg = RunConfig.model_validate({"algo": "luffy", "data": {"train_prompts": 12},
                                    "teacher": {"path": str(build_tiny_model(tmp_path / "teacher")),
                                                "live_traces": mode}})
    train, _ = load_prompt_records(cfg)
    traces = TraceFile(tmp_path / TRACE_FILE)
    for i in (3, 0, 5):
        traces.append(trace_record(train[i], f"The answer is {train[i].ground_truth}."))
    said: list[str] = []
    data = load_run_data(cfg, build_tokenizer(), tmp_path, need_demos=True, reward_fn=lambda *a: 1.0, log=said.append)
    assert sorted(data.demos) == [0, 3, 5] and data.teacher_traced == {0, 3, 5}
    assert data.demo_rewards == {0: 1.0, 3: 1.0, 5: 1.0} and len(data.train) == 12  # every prompt still trains
    assert any("3 traces this run's live teacher kept before it stopped" in s for s in said), said
    teacher = LiveTeacher(cfg, cfg.teacher.path, data, tmp_path, log=said.append)
    assert sorted(teacher.todo) == [i for i in range(12) if i not in (0, 3, 5)]
    assert teacher.counts.metrics() == {"demos/from_file": 0, "demos/from_teacher": 3, "demos/rejected": 0}
