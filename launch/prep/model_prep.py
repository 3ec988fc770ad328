"""The model a run starts from: a local HF directory (or a Hub id's snapshot in the local HF cache,
`launch.prep.hub`), or the built-in tiny model warmed up with SFT.

The tiny model (tasks.build_tiny_model) is random; RL from random weights would never see a reward.
So it is first trained with SFT (the same learner and `sft` algorithm users run) on noisy synthetic
demonstrations — a share `model.sft_error_rate` of them hold one slip — which leaves it at a middling
held-out accuracy that RL must then raise. Both steps are cached under `model.cache_dir`, keyed by
everything that determines them, so only the first run pays (seconds for the build, ~a minute for SFT).
A testbed's warm-up may end before `model.sft_warmup_steps` by a `StopRule` (`launch.prep.testbed`: at a target
held-out accuracy), whose key then enters the cache key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Protocol

import numpy as np

from configs.schema import DataConfig, RunConfig
from launch.prep.demo_batches import DemoBatches

# data keys the warm-up key leaves out: Hub splits (it reads no file), and the prompt keys, which enter as
# the prompt style they make (a .jinja file by its text), and only when not the default
PROMPT_KEYS = ("split", "eval_split", "prompt_format", "system_prompt", "chat_template")


def _key(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


class StopRule(Protocol):
    """Ends a warm-up before its `model.sft_warmup_steps` (`launch.prep.testbed`): `key()` enters the cache key,
    `__call__(steps done, learner)` is asked after every step and returns True to stop there."""

    def key(self) -> dict: ...

    def __call__(self, done: int, learner) -> bool: ...


def run_sft(cfg: RunConfig, model_dir: Path, demos: dict[int, np.ndarray], prompts: dict[int, tuple[int, ...]],
            steps: int, out_dir: Path, log=print, until: StopRule | None = None,
            env: dict[int, np.ndarray] | None = None) -> Path:
    """`steps` optimiser steps of SFT (cfg.algo must be 'sft') on `demos`, fewer if `until` says stop; exports an
    HF dir (fp32 weights) to `out_dir` from a checkpoint beside it, which is then removed. `env`: the
    environment-token masks of multi-turn demonstrations (`DemoBatches`), which take no loss."""
    import torch

    from learner.checkpoint import export_hf
    from learner.learner import Learner

    learner = Learner(cfg, rank=0, world_size=1, model_dir=model_dir)
    batches = DemoBatches(demos, prompts, cfg.learner.batch_prompts, cfg.seed, env)
    for step in range(steps):
        metrics = learner.step(batches.next(), version=step)
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"[sft] step {step + 1}/{steps} nll {metrics.get('sft/nll', metrics.get('loss/total')):.4f}")
        if until is not None and until(step + 1, learner):
            log(f"[sft] stopped after step {step + 1} of at most {steps}")
            break
    ckpt = out_dir.with_name(out_dir.name + ".checkpoint")
    shutil.rmtree(ckpt, ignore_errors=True)
    export_hf(learner.save(ckpt), out_dir, dtype=torch.float32)
    shutil.rmtree(ckpt)
    import torch.distributed as dist

    if dist.is_initialized():  # the one-rank learner made a private process group
        dist.destroy_process_group()
    return out_dir


def warmup_data(cfg: RunConfig) -> DataConfig:
    """The data of the tiny model's SFT warm-up: the synthetic task with the run's `data.arithmetic`, sizes
    and seed, whatever the run trains on (a user's file has no demonstrations to warm up on)."""
    return cfg.data.model_copy(update={"task": "arithmetic", "path": None, "eval_path": None, "demos": None},
                               deep=True)


def base_key(cfg: RunConfig) -> str:
    """The cache key of the built-in tiny model before its warm-up: its architecture and the seed."""
    return _key({"tiny": cfg.model.tiny.model_dump(), "seed": cfg.seed})


def warm_plan(cfg: RunConfig, until: StopRule | None = None) -> tuple[Path, RunConfig]:
    """(the cached directory of the built-in tiny model warmed up as `cfg` says, built or not; the SFT config of
    that warm-up): the path is keyed by everything that determines the model (module docstring)."""
    from configs.loading import resolve
    from launch.prep.data import prompt_style

    # constant LR after a short warm-up: a cosine decay over so few steps leaves the model far weaker
    sft_cfg = resolve("sft", flags={"model.dtype": cfg.model.dtype, "seed": cfg.seed,
                                    "learner.steps": cfg.model.sft_warmup_steps, "learner.lr_schedule": "constant"})
    sft_cfg.data = warmup_data(cfg)
    style = prompt_style(cfg)  # the run's prompt tokens: what the warmed-up model will be asked
    data = sft_cfg.data.model_dump(exclude={"fields", *PROMPT_KEYS})
    if data["arithmetic"]["level"] is None:  # no level: the key it had before levels existed (caches stay valid)
        del data["arithmetic"]["level"]
    warm_key = _key({"base": base_key(cfg), "learner": sft_cfg.learner.model_dump(), "data": data,
                     "error_rate": cfg.model.sft_error_rate, "dtype": cfg.model.dtype,
                     **({"prompt": dataclasses.asdict(style)} if style != type(style)() else {}),
                     **({"until": until.key()} if until is not None else {})})
    return Path(cfg.model.cache_dir) / f"tiny-{base_key(cfg)}-sft-{warm_key}", sft_cfg


def base_model_dir(cfg: RunConfig) -> Path:
    """The built-in tiny model before its warm-up (random weights, the run's architecture), cached."""
    from tasks import build_tiny_model

    t = cfg.model.tiny
    return build_tiny_model(Path(cfg.model.cache_dir) / f"tiny-{base_key(cfg)}", seed=cfg.seed,
                            hidden_size=t.hidden_size, num_heads=t.num_heads, num_layers=t.num_layers,
                            intermediate_size=t.intermediate_size, max_position_embeddings=t.max_position_embeddings)


def prepare_model(cfg: RunConfig, log=print, until: StopRule | None = None) -> Path:
    """Directory of the starting policy: `model.path`, or the cached SFT-warmed tiny model (its warm-up ended
    early by `until`, whose key then enters the cache key)."""
    if cfg.model.path is not None:
        from launch.prep.hub import model_dir

        path = model_dir(cfg.model.path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path: {path} is not an HF model directory (no config.json)")
        return path
    from launch.prep.data import prompt_style
    from tasks import demonstration_records, make_splits

    if cfg.data.task == "file":
        log("[model] the built-in tiny model (a character tokenizer, warmed up on the synthetic arithmetic task) "
            "will score near 0 on your data — pass --model DIR for a real model")

    init = base_model_dir(cfg)
    if cfg.model.sft_warmup_steps == 0:
        return init
    out, sft_cfg = warm_plan(cfg, until)
    style = prompt_style(cfg)
    if (out / "config.json").is_file():  # `out` appears by a rename, complete
        return out
    log(f"[model] warming the tiny model up with {cfg.model.sft_warmup_steps} SFT steps on noisy demonstrations "
        f"(error rate {cfg.model.sft_error_rate:g}); cached in {out}")
    from actors.prompts import encode_prompt, load_tokenizer
    from launch.prep.data import arithmetic_config, tokenize_demos

    tokenizer = load_tokenizer(str(init))
    train, _ = make_splits(cfg.data.train_prompts, cfg.data.eval_prompts, seed=cfg.data.seed,
                           config=arithmetic_config(cfg))
    records = demonstration_records(train, error_rate=cfg.model.sft_error_rate, seed=cfg.data.seed)
    demos = tokenize_demos(records, records, tokenizer, Path("synthetic demonstrations"))
    prompts = {i: tuple(encode_prompt(tokenizer, records[i].prompt, style)) for i in demos}
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    run_sft(sft_cfg, init, demos, prompts, cfg.model.sft_warmup_steps, tmp, log, until)
    tmp.rename(out)
    return out
