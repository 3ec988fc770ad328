"""Reward functions of the field run unchanged: a veRL `compute_score`, a TRL batched function and ours are
told apart by their parameter names and called as their own trainers call them -- through the real
`Scorer`, in its real worker process. The functions below are written here, in each framework's style."""

import asyncio
import json
import textwrap

import numpy as np
import pytest

from tasks.records import Record
from tasks.rewards import RewardSpecError, Scorer, check_reward_fn, data_columns, score_all

FIELD = textwrap.dedent('''
    import json, time
    from pathlib import Path

    SEEN = Path(__file__).with_suffix(".json")  # what the last recording function was given


    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        """veRL style: one scorer per data source, a dict result for one of them."""
        if data_source == "openai/gsm8k":
            return 1.0 if solution_str.split("####")[-1].strip() == ground_truth else 0.0
        if data_source == "lighteval/MATH":
            correct = solution_str.endswith("\\\\boxed{" + ground_truth + "}")
            return {"score": extra_info["weight"] * correct, "acc": correct}
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")


    def verl_no_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"acc": 1.0}


    def verl_record(data_source, solution_str, ground_truth, extra_info=None):
        SEEN.write_text(json.dumps({"data_source": data_source, "solution_str": solution_str,
                                    "ground_truth": ground_truth, "extra_info": extra_info}))
        return 1.0


    def weighted_accuracy(prompts, completions, ground_truth, **kwargs):
        """TRL style: batched, a dataset column read from kwargs; None = no reward for that completion."""
        return [None if w is None else w * float(c.strip().endswith(gt))
                for c, gt, w in zip(completions, ground_truth, kwargs["weight"])]


    def batch_size(completions, **kwargs):
        return [float(len(completions))] * len(completions)


    def trl_record(prompts, completions, **kwargs):
        SEEN.write_text(json.dumps({"prompts": prompts, "completions": completions, **kwargs}))
        return [1.0] * len(completions)


    def one_short(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 1)


    def hangs(prompts, completions, **kwargs):
        if "hang" in completions:
            time.sleep(60)
        return [0.5] * len(completions)


    def positional(p, r, gt, ex):
        return 1.0


    def trl_without_kwargs(prompts, completions):
        return [1.0] * len(completions)


    def needs_solution(prompts, completions, solution, **kwargs):
        return [1.0] * len(completions)
''')


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    path = tmp_path_factory.mktemp("field") / "field_rewards.py"
    path.write_text(FIELD)
    return path


def scorer(field, fn, **kw) -> Scorer:
    return Scorer(f"{field}:{fn}", **kw)


def test_a_verl_compute_score_gets_the_rows_data_source_and_may_return_a_dict(field):
    s = scorer(field, "compute_score")
    try:
        rows = [  # (prompt, response, ground truth, extra = extra_info + data_source)
            ("Natalia sold 48 clips...", "48 + 24 = 72 #### 72", "72", {"data_source": "openai/gsm8k"}),
            ("Natalia sold 48 clips...", "#### 70", "72", {"data_source": "openai/gsm8k"}),
            ("What is 2+3?", "so \\boxed{5}", "5", {"data_source": "lighteval/MATH", "weight": 0.25}),
            ("What is 2+3?", "so \\boxed{6}", "5", {"data_source": "lighteval/MATH", "weight": 0.25}),
        ]
        # gsm8k: "72" == "72" -> 1, "70" != "72" -> 0; MATH: weight 0.25 x correct (True, then False) -> 0.25, 0
        assert s.batch(*zip(*rows)) == [1.0, 0.0, 0.25, 0.0]
        # bound by position (before), data_source was the prompt text: NotImplementedError, scored 0 on every row
        assert s.stats() == {"reward_errors": 0, "reward_timeouts": 0, "reward_first_error": None}
        assert s("q", "#### 1", "1", {"data_source": "other"}) == 0.0
        assert s.errors == 1 and s.first_error == (
            "NotImplementedError: Reward function is not implemented for data_source='other'")
    finally:
        s.close()


def test_a_verl_function_gets_exactly_veRLs_four_keywords(field):
    s = scorer(field, "verl_record")
    try:
        assert s("the question", "the response", "42", {"data_source": "gsm8k", "split": "train", "index": 7}) == 1.0
        assert json.loads(field.with_suffix(".json").read_text()) == {
            "data_source": "gsm8k", "solution_str": "the response", "ground_truth": "42",
            "extra_info": {"split": "train", "index": 7}}  # the row's extra_info, without our data_source key
    finally:
        s.close()


def test_a_dict_without_a_score_is_an_error(field):
    s = scorer(field, "verl_no_score")
    try:
        assert s("p", "r", "g", {"data_source": "x"}) == 0.0
        assert s.errors == 1 and s.first_error == "ValueError: returned a dict without 'score' (keys: acc)"
    finally:
        s.close()


def test_a_trl_function_is_called_once_per_batch_with_the_columns_as_lists(field):
    s = scorer(field, "trl_record")
    try:
        extras = [{"data_source": "math", "level": 3}, {"data_source": "math", "split": "test"}]
        assert s.batch(["q1", "q2"], ["r1", "r2"], ["1", "2"], extras) == [1.0, 1.0]
        assert json.loads(field.with_suffix(".json").read_text()) == {
            "prompts": ["q1", "q2"], "completions": ["r1", "r2"], "ground_truth": ["1", "2"],
            "data_source": ["math", "math"], "level": [3, None], "split": [None, "test"]}  # None: the row lacks it
    finally:
        s.close()
    sizes = scorer(field, "batch_size")
    try:  # one call of 3 completions, then a lone response as one-element lists
        assert sizes.batch(["q"] * 3, ["a", "b", "c"], ["1"] * 3, [{}] * 3) == [3.0, 3.0, 3.0]
        assert sizes("q", "a", "1", {}) == 1.0
    finally:
        sizes.close()


def test_a_trl_function_reading_a_kwargs_column_scores_each_completion(field):
    s = scorer(field, "weighted_accuracy")
    try:
        extras = [{"data_source": "d", "weight": 0.5}] * 2 + [{"data_source": "d", "weight": None}]
        # "... 12" ends with "12": 0.5 x 1; "... 13" does not: 0.5 x 0; weight None -> None: scored 0, an error
        assert s.batch(["q"] * 3, ["so 12", "so 13", "so 12"], ["12"] * 3, extras) == [0.5, 0.0, 0.0]
        assert s.stats() == {"reward_errors": 1, "reward_timeouts": 0,
                             "reward_first_error": "ValueError: returned None, not a finite number (completion 2 of 3)"}
    finally:
        s.close()


def test_a_trl_batch_that_fails_or_hangs_counts_each_completion(field):
    short = scorer(field, "one_short")
    try:
        assert short.batch(["q"] * 2, ["a", "b"], ["1"] * 2, [{}] * 2) == [0.0, 0.0]
        assert short.errors == 2 and short.first_error == "ValueError: returned list [1.0], not a list of 2 rewards"
    finally:
        short.close()
    slow = scorer(field, "hangs", timeout_s=0.5)
    try:  # the batch's limit is 2 x 0.5 s; the killed worker is replaced
        assert slow.batch(["q"] * 2, ["ok", "hang"], ["1"] * 2, [{}] * 2) == [0.0, 0.0]
        assert slow.batch(["q"] * 2, ["ok", "ok"], ["1"] * 2, [{}] * 2) == [0.5, 0.5]
        assert slow.stats() == {"reward_errors": 0, "reward_timeouts": 2, "reward_first_error": None}
    finally:
        slow.close()


SHAPES = ("ours: fn(prompt, response, ground_truth, extra) -> float; veRL: compute_score(data_source, solution_str, "
          "ground_truth, extra_info=None) -> float or {'score': float}; TRL: fn(prompts, completions, **kwargs) -> "
          "list[float] (batched) (parameters are bound by name)")


@pytest.mark.parametrize("fn, params", [("positional", "(p, r, gt, ex)"),
                                        ("trl_without_kwargs", "(prompts, completions)")])
def test_a_signature_that_fits_no_shape_is_refused_naming_the_three(field, fn, params):
    with pytest.raises(RewardSpecError) as err:
        check_reward_fn(f"{field}:{fn}")
    assert str(err.value) == f"reward.fn={field}:{fn}: its parameters {params} fit none of the accepted shapes — {SHAPES}"


def test_a_trl_parameter_must_be_a_column_of_the_data(field):
    name = f"{field}:needs_solution"
    check_reward_fn(name)  # without the data, any column may come
    rows = [Record([{"role": "user", "content": "q"}], "1", data_source="d", extra_info={"level": 1, "id": "a"}),
            Record([{"role": "user", "content": "q"}], "2", data_source="d", extra_info={"level": 2})]
    columns = data_columns(rows)
    assert columns == {"ground_truth", "data_source", "level"}  # "id" is not on every row
    with pytest.raises(RewardSpecError) as err:
        check_reward_fn(name, columns)
    assert str(err.value) == (f"reward.fn={name}: its parameter 'solution' is not a column of the data (each call "
                              "passes data_source, ground_truth, level) — use one of these, or give it a default")
    check_reward_fn(f"{field}:weighted_accuracy", columns)  # ground_truth is a column; weight comes in **kwargs
    for fn in ("compute_score", "batch_size"):
        check_reward_fn(f"{field}:{fn}", columns)


def test_callers_score_a_group_and_demonstrations_in_batched_calls(field, monkeypatch):
    """The actors' group scoring and the driver's demonstration scoring give a batched function one call per
    group / batch (a function returning its batch size shows it); a plain function is called per response."""
    from actors.generate import GroupSampler, SamplingSettings
    from actors.prompts import PromptItem
    from launch.prep import data
    from tasks.tiny_model import build_tokenizer

    tok = build_tokenizer()
    s = scorer(field, "batch_size")
    try:
        sampler = GroupSampler(None, tok, SamplingSettings(), reward_fn=s)
        ids = [tok("1")["input_ids"]] * 3
        assert asyncio.run(sampler._score(ids, PromptItem(0, (1,), "1", "d", "q"))) == [3.0, 3.0, 3.0]
        sampler._pool.shutdown()
        monkeypatch.setattr(data, "DEMO_BATCH", 2)
        train = [Record([{"role": "user", "content": f"q{i}"}], str(i)) for i in range(3)]
        demos = {i: np.asarray(tok(str(i))["input_ids"], dtype=np.int32) for i in range(3)}
        assert data.score_demos(demos, train, tok, s) == {0: 2.0, 1: 2.0, 2: 1.0}  # batches of 2, then 1
    finally:
        s.close()
    assert score_all(lambda p, r, g, e: float(r == g), ["q"] * 2, ["1", "2"], ["1", "1"], [{}] * 2) == [1.0, 0.0]


def test_eval_refuses_a_reward_that_fits_no_shape_before_starting_an_engine(field, tmp_path, capsys):
    from launch.commands.evaluate import main

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    argv = ["--model", str(tmp_path / "model"), "--data", str(tmp_path / "data.jsonl"),
            "--set", f"reward.fn={field}:positional"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"algo-train eval: reward.fn={field}:positional: its parameters (p, r, gt, ex) "
                                       f"fit none of the accepted shapes — {SHAPES}\n")
