"""The run's prompts and demonstrations, tokenised once in the driver.

- Train/eval prompts: the synthetic arithmetic task (disjoint splits) or a veRL parquet/JSONL file
  (held-out prompts from `data.eval_path`, else the file's last `data.eval_prompts` rows).
- Demonstrations (LUFFY teacher traces, SFT targets): a teacher file given with `--demos`, matched to
  the training prompts by their question text; with the synthetic task and no file, one is written
  into the run folder by `tasks.write_teacher_file` and read back through the same loader, so the
  user's path and the default path are the same code.
Demonstration token ids end with the tokenizer's eos: a ρ = 1 LUFFY row is the whole trace + eos.
- Demonstration rewards: each demonstration is scored once, here, with the run's reward function (the
  actors' `actors.generate.default_reward_fn`) exactly as an actor scores a row -- its token ids decoded
  with special tokens skipped, against the matched training prompt's ground truth -- so a wrong teacher
  trace is not reinforced as if it were right. The driver stores these scores with the demonstrations
  (`BufferClient.add_demos(..., rewards=RunData.demo_rewards)`) and the buffer gives them to the ρ = 1
  rows it attaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from actors.prompts import PromptItem, items_from_records
from configs.schema import RunConfig
from tasks import ArithmeticConfig, load_records, make_splits, problem_records, write_teacher_file
from tasks.records import DataError, Record


@dataclass
class RunData:
    train: list[PromptItem]
    eval: list[PromptItem]
    train_records: list[Record]
    skipped_prompts: list[int] = field(default_factory=list)
    demos: dict[int, np.ndarray] = field(default_factory=dict)  # prompt_index -> demo ids (+eos)
    demo_rewards: dict[int, float] = field(default_factory=dict)  # prompt_index -> reward of that demo
    demos_below_one: int = 0  # how many demonstrations score < 1 (wrong or unscorable teacher traces)


def arithmetic_config(cfg: RunConfig) -> ArithmeticConfig:
    a = cfg.data.arithmetic
    return ArithmeticConfig(ops=tuple(a.ops), min_digits=a.min_digits, max_digits=a.max_digits)


def load_prompt_records(cfg: RunConfig) -> tuple[list[Record], list[Record]]:
    d = cfg.data
    if d.task == "arithmetic":
        train, held_out = make_splits(d.train_prompts, d.eval_prompts, seed=d.seed, config=arithmetic_config(cfg))
        return problem_records(train, "train"), problem_records(held_out, "eval")
    records = load_records(d.path)
    if d.eval_path:
        return records, load_records(d.eval_path)[: d.eval_prompts]
    if len(records) <= d.eval_prompts:
        raise DataError(f"{d.path}: {len(records)} rows cannot give {d.eval_prompts} held-out prompts and a "
                        "training set — pass data.eval_path or lower data.eval_prompts")
    return records[: -d.eval_prompts], records[-d.eval_prompts:]


def demonstration_file(cfg: RunConfig, run_dir: Path) -> Path | None:
    """The teacher/demonstration file of this run, writing the synthetic one if needed."""
    if cfg.data.demos:
        return Path(cfg.data.demos)
    if cfg.data.task != "arithmetic":
        return None
    train, _ = make_splits(cfg.data.train_prompts, cfg.data.eval_prompts, seed=cfg.data.seed,
                           config=arithmetic_config(cfg))
    path = run_dir / "teacher.jsonl"
    if not path.exists():
        write_teacher_file(path, train, error_rate=0.0, seed=cfg.data.seed)
    return path


def tokenize_demos(records: list[Record], train: list[Record], tokenizer, source: Path) -> dict[int, np.ndarray]:
    """Demo ids (+eos) keyed by the prompt_index of the training prompt with the same question."""
    index_of = {r.question: i for i, r in enumerate(train)}
    demos, unmatched = {}, 0
    for rec in records:
        i = index_of.get(rec.question)
        if i is None:
            unmatched += 1
            continue
        ids = tokenizer(rec.target, add_special_tokens=False)["input_ids"]
        demos[i] = np.asarray([*ids, tokenizer.eos_token_id], dtype=np.int32)
    if not demos:
        raise DataError(f"{source}: none of its {len(records)} demonstrations matches a training prompt "
                        f"(matched by question text; {unmatched} unmatched)")
    return demos


def score_demos(demos: dict[int, np.ndarray], train: list[Record], tokenizer,
                reward_fn: Callable[[str, str], float]) -> dict[int, float]:
    """Reward of each demonstration, keyed like `demos` (prompt_index -> ids): `reward_fn(text,
    ground truth)` with text = the ids decoded with special tokens skipped (the eos drops out) and the
    ground truth of training prompt `train[prompt_index]` -- what `actors.generate.GroupSampler` does
    with a generated row of that prompt."""
    keys = list(demos)
    texts = tokenizer.batch_decode([demos[i].tolist() for i in keys], skip_special_tokens=True)
    return {i: float(reward_fn(t, train[i].ground_truth)) for i, t in zip(keys, texts)}


def load_run_data(cfg: RunConfig, tokenizer, run_dir: Path, need_demos: bool,
                  reward_fn: Callable[[str, str], float] | None = None, log: Callable[[str], None] = print,
                  ) -> RunData:
    """Prompts and (if `need_demos`) demonstrations with their rewards. reward_fn: the run's reward
    (default `actors.generate.default_reward_fn()`); log: where the one-line demonstration summary goes."""
    train_recs, eval_recs = load_prompt_records(cfg)
    train, skipped = items_from_records(train_recs, tokenizer, cfg.data.max_prompt_tokens)
    held_out, _ = items_from_records(eval_recs, tokenizer, cfg.data.max_prompt_tokens)
    if not train:
        raise DataError(f"no training prompt fits data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    data = RunData(train, held_out, train_recs, skipped)
    if need_demos:
        source = demonstration_file(cfg, run_dir)
        if source is None:
            raise DataError("this algorithm needs demonstrations: pass --demos FILE")
        data.demos = tokenize_demos(load_records(source, require_target=True), train_recs, tokenizer, source)
        if reward_fn is None:
            from actors.generate import default_reward_fn

            reward_fn = default_reward_fn()
        data.demo_rewards = score_demos(data.demos, train_recs, tokenizer, reward_fn)
        data.demos_below_one = sum(r < 1.0 for r in data.demo_rewards.values())
        log(f"[data] {data.demos_below_one} of {len(data.demos)} demonstrations from {source} score < 1 with the "
            "run's reward; their rows are trained with that score")
        with_demo = {i for i in data.demos}
        data.train = [it for it in train if it.prompt_index in with_demo]
        if not data.train:
            raise DataError(f"{source}: no training prompt has a demonstration")
    return data
