"""The model a run starts from: a local HF directory (or a Hub id's snapshot in the local HF cache,
`launch.prep.hub`), or the built-in tiny model warmed up with SFT.

The tiny model (tasks.build_tiny_model) is random; RL from random weights would never see a reward.
So it is first trained with SFT (the same learner and `sft` algorithm users run) on noisy synthetic
demonstrations — a share `model.sft_error_rate` of them hold one slip — which leaves it at a middling
held-out accuracy that RL must then raise. Both steps are cached under `model.cache_dir`, keyed by
everything that determines them, so only the first run pays (seconds for the build, ~a minute for SFT).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from configs.schema import DataConfig, RunConfig
from launch.prep.demo_batches import DemoBatches

# data keys the warm-up key leaves out: Hub splits (it reads no file), and the prompt keys, which enter as
# the prompt style they make (a .jinja file by its text), and only when not the default
PROMPT_KEYS = ("split", "eval_split", "prompt_format", "system_prompt", "chat_template")


def _key(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def run_sft(cfg: RunConfig, model_dir: Path, demos: dict[int, np.ndarray], prompts: dict[int, tuple[int, ...]],
            steps: int, out_dir: Path, log=print) -> Path:
    """`steps` optimiser steps of SFT (cfg.algo must be 'sft') on `demos`; exports an HF dir (fp32 weights)
    to `out_dir` from a checkpoint beside it, which is then removed."""
    import torch

    from learner.checkpoint import export_hf
    from learner.learner import Learner

    learner = Learner(cfg, rank=0, world_size=1, model_dir=model_dir)
    batches = DemoBatches(demos, prompts, cfg.learner.batch_prompts, cfg.seed)
    for step in range(steps):
        metrics = learner.step(batches.next(), version=step)
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"[sft] step {step + 1}/{steps} nll {metrics.get('sft/nll', metrics.get('loss/total')):.4f}")
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


def base_model_dir(cfg: RunConfig) -> Path:
    """The built-in tiny model before its warm-up (random weights, the run's architecture), cached."""
    from tasks import build_tiny_model

    t = cfg.model.tiny
    key = _key({"tiny": t.model_dump(), "seed": cfg.seed})
    return build_tiny_model(Path(cfg.model.cache_dir) / f"tiny-{key}", seed=cfg.seed, hidden_size=t.hidden_size,
                            num_heads=t.num_heads, num_layers=t.num_layers, intermediate_size=t.intermediate_size,
                            max_position_embeddings=t.max_position_embeddings)


def prepare_model(cfg: RunConfig, log=print) -> Path:
    """Directory of the starting policy: `model.path`, or the cached SFT-warmed tiny model."""
    if cfg.model.path is not None:
        from launch.prep.hub import model_dir

        path = model_dir(cfg.model.path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path: {path} is not an HF model directory (no config.json)")
        return path
    from configs.loading import resolve
    from tasks import demonstration_records, make_splits

    if cfg.data.task == "file":
        log("[model] the built-in tiny model (a character tokenizer, warmed up on the synthetic arithmetic task) "
            "will score near 0 on your data — pass --model DIR for a real model")

    init = base_model_dir(cfg)
    base_key = init.name.removeprefix("tiny-")
    root = Path(cfg.model.cache_dir)
    if cfg.model.sft_warmup_steps == 0:
        return init
    # constant LR after a short warm-up: a cosine decay over so few steps leaves the model far weaker
    sft_cfg = resolve("sft", flags={"model.dtype": cfg.model.dtype, "seed": cfg.seed,
                                    "learner.steps": cfg.model.sft_warmup_steps, "learner.lr_schedule": "constant"})
    warm_data = warmup_data(cfg)
    sft_cfg.data = warm_data
    from launch.prep.data import prompt_style

    style = prompt_style(cfg)  # the run's prompt tokens: what the warmed-up model will be asked
    warm_key = _key({"base": base_key, "learner": sft_cfg.learner.model_dump(),
                     "data": warm_data.model_dump(exclude={"fields", *PROMPT_KEYS}),
                     "error_rate": cfg.model.sft_error_rate, "dtype": cfg.model.dtype,
                     **({"prompt": dataclasses.asdict(style)} if style != type(style)() else {})})
    out = root / f"tiny-{base_key}-sft-{warm_key}"
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
    run_sft(sft_cfg, init, demos, prompts, cfg.model.sft_warmup_steps, tmp, log)
    tmp.rename(out)
    return out
