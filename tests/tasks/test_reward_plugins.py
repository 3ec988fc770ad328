"""Rewards as plugins: names, loading checks, the worker's time limit, and failures scored 0 and counted."""

import logging
import textwrap

import pytest
from pydantic import ValidationError

from configs.schema import RunConfig
from tasks.rewards import (
    BUILTINS,
    RewardSpecError,
    Scorer,
    arithmetic,
    check_reward_fn,
    first_error,
    reward_metrics,
    reward_name,
)
from tasks.worker import load_function

PLUGIN = textwrap.dedent('''
    import math, os, time

    def echo(prompt, response, ground_truth, extra):
        print("a plugin's own output")          # must not disturb the worker's protocol
        return len(prompt) + 10 * len(response) + 100 * len(ground_truth) + 1000 * extra["k"]

    def slow(prompt, response, ground_truth, extra):
        if response == "hang":
            time.sleep(60)
        return 0.5

    def fails(prompt, response, ground_truth, extra):
        if response == "ok":
            return 1.0
        raise KeyError(response)

    def nan(prompt, response, ground_truth, extra):
        return math.nan

    def dies(prompt, response, ground_truth, extra):
        if response == "exit":
            os._exit(3)
        return 1.0

    def two(prompt, response):
        return 1.0

    not_a_function = 3
''')


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "my_reward.py"
    path.write_text(PLUGIN)
    return path


def test_a_plugin_file_gets_the_four_arguments(plugin):
    scorer = Scorer(f"{plugin}:echo")
    try:
        # 3 + 10*2 + 100*1 + 1000*4 = 4123
        assert scorer("abc", "xy", "z", {"k": 4}) == 4123.0
        assert scorer.stats() == {"reward_errors": 0, "reward_timeouts": 0, "reward_first_error": None}
    finally:
        scorer.close()


def test_a_timeout_scores_zero_is_counted_and_the_worker_comes_back(plugin):
    scorer = Scorer(f"{plugin}:slow", timeout_s=1.0)
    try:
        assert scorer("p", "fine", "g", {}) == 0.5  # starts the worker
        assert scorer("p", "hang", "g", {}) == 0.0
        assert scorer("p", "fine", "g", {}) == 0.5  # a fresh worker
        assert scorer.stats() == {"reward_errors": 0, "reward_timeouts": 1, "reward_first_error": None}
    finally:
        scorer.close()


def test_errors_score_zero_are_counted_and_the_first_is_logged_once(plugin, caplog):
    scorer = Scorer(f"{plugin}:fails")
    try:
        with caplog.at_level(logging.WARNING, logger="tasks.rewards"):
            assert [scorer("p", r, "g", {}) for r in ("first", "ok", "second")] == [0.0, 1.0, 0.0]
        assert scorer.stats() == {"reward_errors": 2, "reward_timeouts": 0, "reward_first_error": "KeyError: 'first'"}
        assert [r.getMessage() for r in caplog.records] == [
            f"reward {plugin}:fails failed, scored 0 (later failures are only counted): KeyError: 'first'"]
    finally:
        scorer.close()


@pytest.mark.parametrize("fn, response, message", [
    ("nan", "r", "ValueError: returned nan, not a finite number"),
    ("dies", "exit", "exited (code 3)"),
])
def test_non_numbers_and_dead_workers_are_errors(plugin, fn, response, message):
    scorer = Scorer(f"{plugin}:{fn}")
    try:
        assert scorer("p", response, "g", {}) == 0.0
        assert scorer.errors == 1 and message in scorer.first_error
        if fn == "dies":
            assert scorer("p", "ok", "g", {}) == 1.0  # restarted
    finally:
        scorer.close()


def test_builtins_are_registered_as_functions_of_the_same_four_arguments():
    assert sorted(BUILTINS) == ["arithmetic", "math_verify"]
    for builtin in BUILTINS.values():
        assert list(__import__("inspect").signature(load_function(builtin.target)).parameters) == [
            "prompt", "response", "ground_truth", "extra"]
    assert arithmetic("", "so \\boxed{ 042 }", "42", {}) == 1.0  # integers compare as integers
    assert arithmetic("", "\\boxed{41}", "42", {}) == 0.0
    math = Scorer("math_verify")
    try:  # 2/4 = 0.5 by math-verify; [-2,7] vs [-2, 7] differ only in spacing; 1/3 != 0.5
        got = [math("", r, g, {}) for r, g in [("\\boxed{\\frac{2}{4}}", "0.5"), ("\\boxed{[-2,7]}", "[-2, 7]"),
                                               ("\\boxed{\\frac{1}{3}}", "0.5"), ("no box", "1")]]
        assert got == [1.0, 1.0, 0.0, 0.0]
    finally:
        math.close()


def test_default_reward_follows_the_task():
    assert reward_name(RunConfig()) == "arithmetic"
    assert reward_name(RunConfig(data={"task": "file", "path": "x.jsonl"})) == "math_verify"
    assert reward_name(RunConfig(reward={"fn": "math_verify"})) == "math_verify"


@pytest.mark.parametrize("name, message", [
    ("no_such_module_xyz:f", "reward.fn=no_such_module_xyz:f: No module named 'no_such_module_xyz' — install it"),
    ("{plugin}:missing", "reward.fn={plugin}:missing: {plugin} has no attribute 'missing'"),
    ("{plugin}:not_a_function", "reward.fn={plugin}:not_a_function: {plugin}:not_a_function is a int, not a "
                                "function"),
    ("{plugin}:two", "reward.fn={plugin}:two: its parameters (prompt, response) fit none of the accepted shapes "
                     "— ours: fn(prompt, response, ground_truth, extra) -> float; veRL: "),
    ("{dir}/absent.py:f", "reward.fn={dir}/absent.py:f: no file {dir}/absent.py"),
    ("{dir}/broken.py:f", "reward.fn={dir}/broken.py:f: importing it raised ZeroDivisionError: division by zero"),
])
def test_a_bad_reward_fn_is_refused_in_one_line(plugin, name, message):
    (plugin.parent / "broken.py").write_text("1 / 0\n")
    name, message = (s.format(plugin=plugin, dir=plugin.parent) for s in (name, message))
    with pytest.raises(RewardSpecError) as err:
        check_reward_fn(name)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_good_names_pass_the_check(plugin):
    for name in ("arithmetic", "math_verify", f"{plugin}:echo", "tasks.rewards:arithmetic"):
        check_reward_fn(name)


def test_schema_checks_the_form_and_makes_files_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert RunConfig(reward={"fn": "rewards/mine.py:score"}).reward.fn == f"{tmp_path}/rewards/mine.py:score"
    assert RunConfig(reward={"fn": "pkg.mod:score"}).reward.fn == "pkg.mod:score"
    with pytest.raises(ValidationError, match="'mathverify' is not arithmetic, math_verify, module:function or "
                                              "path/to/file.py:function — set reward.fn to one of these"):
        RunConfig(reward={"fn": "mathverify"})


def test_pure_rule_scorer_outside_the_arithmetic_task_is_refused_at_parse():
    file_data = {"task": "file", "path": "math.jsonl"}
    with pytest.raises(ValidationError, match="pure.prm: the rule step checker reads only the synthetic arithmetic "
                                              "task — with data.task=file use pure.prm=hf with pure.prm_path=DIR"):
        RunConfig(algo="pure", data=file_data)
    assert RunConfig(algo="pure", data=file_data, pure={"prm": "my_prm:score_steps"}).pure.prm == "my_prm:score_steps"
    assert RunConfig(algo="grpo", data=file_data).pure.prm == "rule"  # only PURE reads it


def test_actor_reports_sum_into_metrics():
    reports = [{"reward_errors": 2, "reward_timeouts": 0, "reward_first_error": None},
               {"reward_errors": 1, "reward_timeouts": 3, "reward_first_error": "KeyError: 'x'"}, {}]
    assert reward_metrics(reports) == {"reward/errors": 3, "reward/timeouts": 3}  # 2+1, 0+3
    assert first_error(reports) == "KeyError: 'x'" and first_error(reports[:1]) is None
