"""Checks of every file and plugin a run names, before anything starts (`preflight`).

Why: a missing tokenizer, a broken teacher row or a data file too small for the held-out split would
otherwise surface seconds to minutes later, inside Ray or the buffer, as a long traceback with a run
folder half made. `preflight` reads everything the run will read, in the driver, and stops at the first
problem with a `PreflightError` whose message is one or two lines: the config key, what is wrong, the fix.
It writes nothing. Checked, in order:

- vLLM (runs with actors): the installed release is the one the weight sync and the actors are written
  against (`launch.planning.versions`; another one fails inside an engine, minutes later);
- model.path: a directory (or a Hub id in the local HF cache, `launch.prep.hub`) with config.json (valid
  JSON), weights (*.safetensors / *.bin) and a tokenizer that loads (model.trust_remote_code), has an eos
  token and a chat template unless the run brings its own (data.chat_template) or uses none
  (data.prompt_format=raw); its context
  (max_position_embeddings) holds data.max_prompt_tokens + rollout.max_response_tokens (every vLLM
  engine would fail at start otherwise, after the learner has loaded);
- the prompts: data.path / data.eval_path load whole (`tasks.loaders`: the file, line and field of a bad
  row; a Hub dataset needs the `datasets` package), hold rows, and leave a training set after the held-out
  split; the synthetic task has enough distinct problems; the first training prompt renders in the run's
  prompt style (`launch.prep.data.prompt_style`: a chat template that fails on it fails here);
- data.demos (algorithms that train on demonstrations): loads whole with a demonstration per row, and
  gives at least data.min_demo_match of the training prompts a demonstration (by question text);
- env.tools / env.environment: each tool loads and can be described to the model (typed, documented), the
  environment class loads, is made without arguments and its reset/step take one argument, and the chat
  template renders tool results and observations by appending (`check_env`);
- model.lora (when on): its targets, rank and model type fit the model (`launch.prep.lora_check`);
- reward.fn: loads and its parameter names fit our, veRL's or TRL's shape, a TRL one's columns those of the
  data (`tasks.rewards.check_reward_fn`);
- the files and plugins the algorithm names (`AlgoSpec.files`, e.g. PURE's step scorer): an HF directory
  with a tokenizer, or a function that loads;
- teacher.path (algorithms that require the teacher's log-probs, `--algo opd`, and LUFFY with
  teacher.live_traces on): set, an HF directory (or a
  cached Hub id) whose config transformers reads, with a logit for every token id of the student, and the
  student's tokenizer (`launch.prep.teacher_check`: vocabulary, eos/bos, chat template).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import algos
from algos.spec import TEACHER
from configs.loading import value_of
from configs.schema import RunConfig
from launch.planning.versions import vllm_problem
from launch.prep.data import load_prompt_records, match_demos, prompt_style, read_file
from launch.prep.hub import ModelNotCached, model_dir
from launch.prep.lora_check import lora_problem
from launch.prep.teacher_check import FIX, tokenizer_difference
from tasks.loaders import HUB_DATA
from tasks.records import DataError
from tasks.rewards import RewardSpecError, check_reward_fn, data_columns, reward_name
from tasks.worker import load_function


class PreflightError(Exception):
    """A file or plugin the run names cannot be used; the message names the key and the fix."""


def preflight(cfg: RunConfig) -> None:
    """Raise `PreflightError` at the first problem (module docstring); return None when all is usable."""
    spec = algos.get(cfg.algo)
    if not spec.trains_on_demonstrations_only and (problem := vllm_problem()):
        raise PreflightError(problem)
    tokenizer = None
    if cfg.model.path is not None:
        try:
            path = model_dir(cfg.model.path)
        except ModelNotCached as e:
            raise PreflightError(str(e)) from None
        tokenizer = check_hf_dir("model.path", path, cfg.model.trust_remote_code)
        if tokenizer.eos_token_id is None:
            raise PreflightError(f"model.path: the tokenizer in {path} has no eos token — set tokenizer.eos_token "
                                 "and save it")
        if (not getattr(tokenizer, "chat_template", None) and cfg.data.chat_template is None
                and cfg.data.prompt_format == "chat"):
            raise PreflightError(f"model.path: the tokenizer in {path} has no chat template (prompts are "
                                 "chat-formatted) — give one with data.chat_template, or use data.prompt_format=raw "
                                 "for a base model")
        check_context(cfg, path)
    if problem := lora_problem(cfg, path if cfg.model.path is not None else None):
        raise PreflightError(problem)
    train = check_prompts(cfg)  # (training, held-out) records
    check_prompt_style(cfg, tokenizer, train[0][:1])
    if spec.needs_demonstrations and cfg.data.demos:
        check_demos(cfg, *train)
    try:
        check_reward_fn(reward_name(cfg), data_columns(train[0] + train[1]))
    except RewardSpecError as e:
        raise PreflightError(str(e)) from None
    for key, kind in spec.files(cfg):
        check_algorithm_file(cfg, key, kind)
    check_env(cfg, tokenizer)
    if TEACHER in spec.requires(cfg) or cfg.teacher.live_traces != "off":  # it must load for either use
        check_teacher(cfg, tokenizer)
    if cfg.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise PreflightError("logging.wandb: the wandb package is not installed — `pip install wandb`, or set "
                             "logging.wandb=false")


def check_context(cfg: RunConfig, path: Path) -> None:
    """The model's context (`max_position_embeddings` of its config.json) holds a prompt and a response."""
    from launch.planning.model_shape import ModelShape, context_problem

    try:
        shape = ModelShape.read(path)
    except (KeyError, TypeError, ValueError):  # a config.json of another layout: vLLM checks at start
        return
    problem = context_problem(shape, cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens, f"the model {path}")
    if problem:
        raise PreflightError(problem)


def check_hf_dir(key: str, path: Path, trust_remote_code: bool = False):
    """The tokenizer of `path`, an HF model directory with config.json and weights (else `PreflightError`)."""
    fix = f"{key} must be a local HF model directory (config.json, tokenizer and weights, as save_pretrained writes)"
    if not path.is_dir():
        raise PreflightError(f"{key}: {path} is not a directory — {fix}")
    config = path / "config.json"
    if not config.is_file():
        raise PreflightError(f"{key}: {path} has no config.json — {fix}")
    try:
        json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PreflightError(f"{key}: {config} is not readable JSON ({e}) — {fix}") from None
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise PreflightError(f"{key}: {path} holds no weights (*.safetensors or *.bin) — {fix}")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise PreflightError(f"{key}: the tokenizer in {path} does not load ({why}) — save it there with "
                             "tokenizer.save_pretrained(DIR)") from None


def check_prompts(cfg: RunConfig) -> tuple[list, list]:
    """The (training, held-out) records, or the `PreflightError` of the first file or split that cannot give them."""
    d = cfg.data
    if d.task == "file" and d.path is None:  # only algorithms that train on demonstrations alone get here
        raise PreflightError("data.path: data.task=file needs the training prompts — pass --data FILE (the same "
                             "file as --demos when the teacher file is your training set)")
    for key in ("data.path", "data.eval_path", "data.demos"):
        value = getattr(d, key.split(".")[1])
        if value is not None and value.startswith(HUB_DATA):
            if importlib.util.find_spec("datasets") is None:
                raise PreflightError(f"{key}: {value} is a Hub dataset, read with the `datasets` package, which is "
                                     "not installed — `pip install datasets`, or save the data as a .jsonl file")
        elif d.task == "file" and value is not None and key != "data.demos" and not Path(value).is_file():
            raise PreflightError(f"{key}: no file {value} — pass a .jsonl, .json or .parquet file, or "
                                 f"{HUB_DATA}NAME[:CONFIG] for a Hub dataset")
    try:
        train, held_out = load_prompt_records(cfg)
    except DataError as e:  # names the file, line and field, or data.eval_prompts
        raise PreflightError(str(e)) from None
    except ValueError as e:  # the synthetic task's problem space is too small
        raise PreflightError(f"data.train_prompts: {e} — lower data.train_prompts / data.eval_prompts or widen "
                             "data.arithmetic (more digits or operators)") from None
    if d.task == "file" and d.eval_path and not held_out:
        raise PreflightError(f"data.eval_path: {d.eval_path} has no rows — pass a file with held-out prompts")
    return train, held_out


def check_prompt_style(cfg: RunConfig, tokenizer, records: list) -> None:
    """The run's prompt style (`prompt_style`: a .jinja file that reads) renders `records` with `tokenizer`
    (None: the built-in model's, checked only when the style is not the default)."""
    d = cfg.data
    try:
        style = prompt_style(cfg)
    except DataError as e:
        raise PreflightError(str(e)) from None
    if tokenizer is None:
        if d.chat_template is None and d.system_prompt is None and d.prompt_format == "chat":
            return
        from tasks.tiny_model import build_tokenizer

        tokenizer = build_tokenizer()
    from actors.prompts import encode_prompt

    for rec in records:
        try:
            encode_prompt(tokenizer, rec.prompt, style)
        except Exception as e:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            key = "data.chat_template" if d.chat_template else "model.path"
            raise PreflightError(f"{key}: the chat template fails on the first training prompt ({why}) — fix the "
                                 "template, or give one with data.chat_template") from None


def check_demos(cfg: RunConfig, train: list, held_out: list = ()) -> None:
    """data.demos loads with a demonstration on every row and gives at least data.min_demo_match of the
    training prompts theirs (`launch.prep.data.match_demos`)."""
    path = cfg.data.demos
    if not path.startswith(HUB_DATA) and not Path(path).is_file():
        raise PreflightError(f"data.demos: no file {path} — pass --demos FILE (.jsonl or .parquet with a "
                             "demonstration column: target, solution, or data.fields.solution)")
    try:
        records = read_file(cfg, path, require_target=True)
    except DataError as e:
        raise PreflightError(f"data.demos: {e}") from None
    match = match_demos(records, train, held_out)
    if not match.demos:
        raise PreflightError(f"data.demos: none of the {len(records)} demonstrations in {path} has the question of a "
                             "training prompt (they are matched by question text) — give the teacher file of "
                             "the training data")
    problem = match.problem(path, cfg.data.min_demo_match)
    if problem and cfg.teacher.live_traces == "off":  # else the live teacher writes the missing ones
        raise PreflightError(problem)


def check_algorithm_file(cfg: RunConfig, key: str, kind: str) -> None:
    """One file or plugin an algorithm names (`AlgoSpec.files`): the dotted `key` holds an HF model
    directory (kind "hf_dir") or a module:function / file.py:function that must load ("function")."""
    value = value_of(cfg, key)
    if kind == "hf_dir":
        check_hf_dir(key, Path(value), cfg.model.trust_remote_code)
    elif kind == "function":
        try:
            load_function(value)
        except Exception as e:
            raise PreflightError(f"{key}={value}: {type(e).__name__}: {e}") from None
    else:
        raise ValueError(f"{cfg.algo}: unknown kind {kind!r} of {key} in AlgoSpec.files; use hf_dir or function")


def check_env(cfg: RunConfig, tokenizer) -> None:
    """`env:`: the tools and the environment class load and fit (module docstring), before anything starts."""
    if not cfg.env.enabled:
        return
    from envs.environment import load_environment_class
    from envs.render import ObservationRenderer
    from envs.tools import Toolbox, ToolLoadError, load_tool

    try:
        toolbox = Toolbox([load_tool(s) for s in cfg.env.tools], cfg.env.call_timeout_s, threads=1)
        toolbox.close()
        if cfg.env.environment is not None:
            load_environment_class(cfg.env.environment)
    except ToolLoadError as e:
        raise PreflightError(str(e)) from None
    if tokenizer is None:
        from tasks.tiny_model import build_tokenizer

        tokenizer = build_tokenizer()
    try:
        renderer = ObservationRenderer(tokenizer, prompt_style(cfg).chat_template, toolbox.schemas or None)
        renderer.text([{"role": "tool" if cfg.env.tools else "user", "content": "1"}])
    except Exception as e:
        raise PreflightError(f"env: the chat template cannot render an observation after a policy turn ({e}) — "
                             "give one that renders tool/user messages with data.chat_template") from None


def check_teacher(cfg: RunConfig, student_tokenizer=None) -> None:
    """teacher.path names a loadable HF model with the student's tokenizer (`launch.prep.teacher_check`);
    `student_tokenizer`: model.path's (None: the built-in model's)."""
    if cfg.teacher.path is None:
        raise PreflightError(f"teacher.path: --algo {cfg.algo} distills from a teacher and none is named — set "
                             "teacher.path to a local HF model directory or a Hub id in the local HF cache "
                             "(--set teacher.path=DIR)")
    try:
        path = model_dir(cfg.teacher.path, key="teacher.path")
    except ModelNotCached as e:
        raise PreflightError(str(e)) from None
    teacher = check_hf_dir("teacher.path", path, cfg.model.trust_remote_code)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=cfg.model.trust_remote_code)
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise PreflightError(f"teacher.path: transformers cannot read the model config in {path} ({why}) — point "
                             "teacher.path at a model this transformers loads (or set model.trust_remote_code "
                             "for one that ships its code)") from None
    if student_tokenizer is None:
        from tasks.tiny_model import build_tokenizer

        student_tokenizer = build_tokenizer()
    d = cfg.data
    difference = tokenizer_difference(student_tokenizer, teacher,
                                      compare_template=d.prompt_format == "chat" and d.chat_template is None)
    if difference:
        raise PreflightError(f"teacher.path: the teacher's tokenizer ({path}) is not the student's: {difference} "
                             f"— {FIX}")
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    if vocab is not None and vocab < len(student_tokenizer):
        raise PreflightError(f"teacher.path: the teacher's model has {vocab} logits (config.json vocab_size) but the "
                             f"tokenizer has {len(student_tokenizer)} tokens — save the model with its embeddings "
                             "resized to the tokenizer (model.resize_token_embeddings(len(tokenizer)))")
