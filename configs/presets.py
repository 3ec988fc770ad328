"""Presets that fit the model: which values a run starts from, decided in one place.

Why two sets: every algorithm's YAML (configs/<algo>.yaml) is tuned for the built-in tiny model and the
synthetic task, e.g. lr 1e-4 (the tiny model needs it; 2e-4 collapsed a seed, bench/RESULTS.md) and
256 prompt / 128 response tokens. A user's model trained with those values would take steps ~100x too
large and cut every response after 128 tokens. So when `model.path` names a model (a directory or a Hub
id) the values of `REAL_MODEL` (and the algorithm's own in `REAL_MODEL_BY_ALGO`) are laid between the
algorithm's YAML and the user's keys: a key the user set (in a --config file, with a flag or with --set)
keeps the user's value; every other key of the set gets the real-model value. The built-in tiny model
(model.path null, or a directory the run built under model.cache_dir: its SFT warm-ups, which the bench
studies pass as model.path) keeps its YAML exactly: the quick-start's configuration does not change.

Fitted to the model's context: 1024 + 3072 tokens do not fit a model built for fewer (max_position_embeddings
of its config.json, read from the directory or the local HF cache of a Hub id), and vLLM would not start.
Then the limits the set gives shrink to fit it: both given by the set, the prompt gets a quarter of the
context (at most 1024) and the response the rest; one the user set, the other gets what is left. A model
whose config.json cannot be read yet is not fitted (the preflight refuses a context that is too short).

Where each value comes from (docs/running.md "Presets that fit the model" has the table):
  learner.lr 1e-6: veRL's actor default (verl/trainer/config/actor/actor.yaml, optim.lr) and its 7B GRPO
      example (examples/grpo_trainer/run_qwen2_5-7b_math.sh); OpenRLHF's --actor_learning_rate default
      (openrlhf/cli/train_ppo_ray.py); the LUFFY (exp_scripts/train.sh) and PACS (scripts/pacs/
      pacs_beta_1.0.sh) 7B scripts; PURE's paper for its VR and PRM+VR runs.
  PRIME: learner.lr 5e-7 and prime.prm_lr 1e-6: veRL's recipe/prime/run_prime_qwen.sh and the PRIME
      paper (policy 5e-7, implicit PRM 1e-6).
  SFT: learner.lr 1e-5: veRL's verl/trainer/config/sft_trainer.yaml (optim.lr).
  data.max_prompt_tokens 1024: veRL's 7B GRPO example and PRIME recipe, LUFFY's script, OpenRLHF's
      --prompt_max_len default, PURE's train_pure.sh.
  rollout.max_response_tokens 3072: the PRIME recipe (data.max_response_length=3072). 1024 + 3072 = 4096
      fits the context of Qwen2.5-Math-7B, the docs' recipe model; the papers range from 2048 (PURE's
      OpenRLHF script) over 4096 (PACS' scripts) to 8192 (LUFFY, on a 16k-context copy of the model).
  learner.micro_batch_tokens 16384: veRL's actor.ppo_max_token_len_per_gpu default (actor.yaml);
      OpenRLHF's --train_max_tokens_per_gpu is 16192.
  rollout.engine.max_num_seqs 1024: veRL's rollout default (verl/trainer/config/rollout/rollout.yaml),
      and vLLM 0.32's own offline default on GPUs of 70 GiB or more (EngineArgs.get_batch_defaults); an
      AsyncLLM (this project's engines, UsageContext.ENGINE_CONTEXT) otherwise schedules at most
      SchedulerConfig.DEFAULT_MAX_NUM_SEQS = 128 sequences at once.
  rollout.engine.max_num_batched_tokens 8192: veRL's rollout default (rollout.yaml, max_num_batched_tokens),
      and vLLM 0.32's own default for its OpenAI server on GPUs of 70 GiB or more that are not A100s
      (EngineArgs.get_batch_defaults; its offline LLM class gets 16384 there). An AsyncLLM otherwise falls back
      to SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048, so new prompts (a 1024-token prompt group is
      1024 tokens) and re-prefills went through in 2048-token slices. Why not 16384: every step that carries a
      prefill chunk also carries the decode token of each running sequence (~200 at 4k tokens on an 80 GB
      GPU), which then waits for the whole chunk: 8192 keeps that step a few times a decode step.
  rollout.prompts_in_flight auto: each engine's concurrency sized from its KV cache and the staleness
      credit (`configs.concurrency`); the tiny model's YAMLs keep the 16 measured on CPU.

Typed and torch-free like the rest of configs/: pure functions of the mapping `configs.loading` builds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from configs.data_section import DataConfig
from configs.shared import ModelConfig, RolloutConfig

REAL_MODEL: dict[str, Any] = {  # dotted key -> value for a user's model (sources: module docstring)
    "learner.lr": 1e-6,
    "data.max_prompt_tokens": 1024,
    "rollout.max_response_tokens": 3072,
    "learner.micro_batch_tokens": 16384,
    "rollout.engine.max_num_seqs": 1024,
    "rollout.engine.max_num_batched_tokens": 8192,
    "rollout.prompts_in_flight": "auto",
}
REAL_MODEL_BY_ALGO: dict[str, dict[str, Any]] = {  # an algorithm's own real-model values, over REAL_MODEL's
    "prime": {"learner.lr": 5e-7, "prime.prm_lr": 1e-6},
    "sft": {"learner.lr": 1e-5},
}
PROMPT, RESPONSE = "data.max_prompt_tokens", "rollout.max_response_tokens"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # org/name (launch.prep.hub reads it the same way)


def real_model_values(algo: str | None) -> dict[str, Any]:
    """The real-model set of `algo`: the shared values with the algorithm's own laid over them."""
    return {**REAL_MODEL, **REAL_MODEL_BY_ALGO.get(algo or "", {})}


def built_in(path: str | None, cache_dir: str) -> bool:
    """Whether `path` is the built-in tiny model: null, or a directory under model.cache_dir (module docstring).
    A value of the wrong type counts as built in: the schema refuses it, naming the key."""
    if not isinstance(path, str) or not isinstance(cache_dir, str):
        return True
    return Path(path).expanduser().resolve().is_relative_to(Path(cache_dir).expanduser().resolve())


def model_context(path: str) -> int | None:
    """max_position_embeddings of the model's config.json (a directory, or the cached snapshot of a Hub id in
    the local HF cache); None when it cannot be read here."""
    config = Path(path).expanduser() / "config.json"
    if not config.is_file() and _HUB_ID.fullmatch(path) and not Path(path).exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(path, "config.json")
        except (ImportError, ValueError):
            found = None
        config = Path(found) if isinstance(found, str) else config
    try:
        c = json.loads(config.read_text())
        return int(c.get("text_config", c)["max_position_embeddings"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def planned(algo: str | None, path: str | None, cache_dir: str, given: set[str], prompt: int,
            response: int) -> tuple[dict[str, Any], int | None]:
    """(the real-model values a config gets, the context they were fitted to or None): nothing for the built-in
    model, else the set less the keys the user gave (`given`), its token limits fitted to the model's context
    (module docstring). prompt/response: the config's limits where the user gave them."""
    if built_in(path, cache_dir):
        return {}, None
    values = {k: v for k, v in real_model_values(algo).items() if k not in given}
    context = model_context(path)
    p, r = values.get(PROMPT, prompt), values.get(RESPONSE, response)
    if context is None or p + r <= context or (PROMPT not in values and RESPONSE not in values):
        return values, None
    if PROMPT in values and RESPONSE in values:
        values[PROMPT] = min(p, context // 4)
        values[RESPONSE] = context - values[PROMPT]
        return values, context
    fit, users = (PROMPT, r) if PROMPT in values else (RESPONSE, p)  # the set's key, and the user's other limit
    if context - users >= 1:
        values[fit] = context - users
    return values, context


def _value(data: dict[str, Any], key: str, default: Any = None) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node.get(part, default) if isinstance(node, dict) else default
    return node


def fit_model(data: dict[str, Any], given: set[str]) -> None:
    """Lay the real-model set under the user's keys of the configuration mapping `data` (in place) when its
    model.path names a user's model; `given`: the dotted keys the user set."""
    values, _ = planned(data.get("algo"), _value(data, "model.path"),
                        _value(data, "model.cache_dir", ModelConfig.model_fields["cache_dir"].default), given,
                        _value(data, PROMPT, DataConfig.model_fields["max_prompt_tokens"].default),
                        _value(data, RESPONSE, RolloutConfig.model_fields["max_response_tokens"].default))
    for key, value in values.items():
        *sections, name = key.split(".")
        node = data
        for part in sections:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):  # a section the user gave as a value is refused by the schema, naming it
            node[name] = value


def _show(value: Any) -> str:
    return "null" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def describe(cfg, given: set[str]) -> str:
    """The one line saying which set a parsed (not yet launch-resolved) config started from and why: the
    algorithm's YAML for the built-in tiny model, or real-model values for a user's model, naming the keys
    fitted to its context and those where the user's own value stands (`given`: the keys the command gave)."""
    every, dumped = real_model_values(cfg.algo), cfg.model_dump()
    now = {key: _value(dumped, key) for key in every}
    shown = ", ".join(f"{key}={_show(v)}" for key, v in now.items())
    if built_in(cfg.model.path, cfg.model.cache_dir):
        what = "null" if cfg.model.path is None else f"{cfg.model.path}, a directory under model.cache_dir"
        return (f"[presets] model.path is {what}: the built-in tiny model, so configs/{cfg.algo}.yaml's values, "
                f"tuned for it ({shown})")
    values, context = planned(cfg.algo, cfg.model.path, cfg.model.cache_dir, given, cfg.data.max_prompt_tokens,
                              cfg.rollout.max_response_tokens)
    real = ", ".join(f"{key}={_show(now[key])}" for key in values if values[key] == every[key])
    fitted = ", ".join(f"{key}={_show(now[key])}" for key in values if values[key] != every[key])
    mine = ", ".join(f"{key}={_show(now[key])}" for key in every if key not in values)
    fitted = f"; fitted to its context of {context:,} tokens: {fitted}" if fitted else ""
    return (f"[presets] model.path is a user model ({cfg.model.path}): real-model values for {real or 'no key'} "
            f"(docs/running.md \"Presets that fit the model\"){fitted}" + (f"; yours: {mine}" if mine else ""))
