"""The run's prompts and demonstrations, tokenised once in the driver.

- Train/eval prompts: the synthetic arithmetic task (disjoint splits) or a parquet/JSONL/JSON file or
  Hub dataset (`hf://NAME[:CONFIG]`, split `data.split` / `data.eval_split`) in a layout `tasks.loaders`
  recognises, columns overridable with `data.fields` (held-out prompts from `data.eval_path`, else the
  file's last `data.eval_prompts` rows). Each file's layout is logged once, and so are the prompts skipped
  for being longer than `data.max_prompt_tokens`. Prompts become token ids here, once, in the run's
  `prompt_style` (system prompt, chat template or raw text): the actors generate from those ids and the
  learner trains on them.
- Demonstrations (LUFFY teacher traces, SFT targets): a teacher file given with `--demos`, matched to
  the training prompts by their question text; with the synthetic task and no file, one is written
  into the run folder by `tasks.write_teacher_file` and read back through the same loader, so the
  user's path and the default path are the same code. Nothing is dropped silently: the start-up line
  (`DemoMatch.describe`) counts and names the teacher rows matching no prompt and the training prompts
  without a demonstration (not trained); preflight refuses a file covering less than data.min_demo_match.
Demonstration token ids end with the tokenizer's eos: a ρ = 1 LUFFY row is the whole trace + eos.
- Demonstration rewards: each demonstration is scored once, here, with the run's reward (`reward.fn`,
  `tasks.rewards.scorer_for`) exactly as an actor scores a row -- its token ids decoded with special
  tokens skipped, against the matched training prompt's question, ground truth and extra -- so a wrong teacher
  trace is not reinforced as if it were right. The driver stores these scores with the demonstrations
  (`BufferClient.add_demos(..., rewards=RunData.demo_rewards)`) and the buffer gives them to the ρ = 1
  rows it attaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from actors.prompts import PromptItem, PromptStyle, items_from_records, with_demos
from configs.data_section import is_template_file
from configs.schema import RunConfig
from launch.prep.teacher_traces import TRACE_FILE
from tasks import ArithmeticConfig, make_splits, problem_records, write_teacher_file
from tasks.loaders import load_dataset
from tasks.records import DataError, Record
from tasks.rewards import score_all, scorer_for

DEMO_BATCH = 64  # demonstrations per call of a batched reward: a hung call costs 64 × reward.timeout_s, not the file's


@dataclass
class RunData:
    train: list[PromptItem]
    eval: list[PromptItem]
    train_records: list[Record]
    skipped_prompts: list[int] = field(default_factory=list)
    demos: dict[int, np.ndarray] = field(default_factory=dict)  # prompt_index -> demo ids (+eos)
    demo_rewards: dict[int, float] = field(default_factory=dict)  # prompt_index -> reward of that demo
    demos_below_one: int = 0  # how many demonstrations score < 1 (wrong or unscorable teacher traces)
    teacher_traced: set[int] = field(default_factory=set)  # prompts whose demo is a live teacher's trace this run
    # kept before it was stopped (its own TRACE_FILE, read on a resume): the teacher never traces them again


def arithmetic_config(cfg: RunConfig) -> ArithmeticConfig:
    a = cfg.data.arithmetic
    return ArithmeticConfig(ops=tuple(a.ops), min_digits=a.min_digits, max_digits=a.max_digits)


def prompt_style(cfg: RunConfig) -> PromptStyle:
    """The run's `PromptStyle` (data.prompt_format, data.system_prompt, data.chat_template); a .jinja file is
    read here, in the driver: only token ids leave it."""
    d = cfg.data
    template = d.chat_template
    if template is not None and is_template_file(template):
        try:
            template = Path(template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"data.chat_template: cannot read {d.chat_template} ({getattr(e, 'strerror', None) or e})"
                            " — give an existing .jinja file or the template text") from None
    return PromptStyle(d.system_prompt, template, raw=d.prompt_format == "raw", tools=tool_schemas(cfg))


def tool_schemas(cfg: RunConfig) -> list[dict] | None:
    """The JSON schemas of `env.tools`, offered to the model in its prompts; None without tools."""
    if not cfg.env.tools:
        return None
    from envs.tools import load_tool, tool_schema

    return [tool_schema(load_tool(spec)) for spec in cfg.env.tools]


def read_file(cfg: RunConfig, path: str | Path, *, require_target: bool = False,
              log: Callable[[str], None] | None = None, split: str | None = None) -> list[Record]:
    """The records of one data file (or split of a Hub dataset: `split`, default data.split) with
    `data.fields` applied; `log` gets its layout in one line."""
    fields = {ours: col for ours, col in (("prompt", cfg.data.fields.prompt), ("ground_truth", cfg.data.fields.answer),
                                          ("target", cfg.data.fields.solution)) if col}
    records, layout = load_dataset(path, fields, require_target=require_target, split=split or cfg.data.split)
    if log:
        log(f"[data] {path}: {len(records)} rows, layout {layout.describe()}")
    return records


def load_prompt_records(cfg: RunConfig, log: Callable[[str], None] | None = None,
                        ) -> tuple[list[Record], list[Record]]:
    """(training, held-out) records of the run (module docstring)."""
    d = cfg.data
    if d.task == "arithmetic":
        train, held_out = make_splits(d.train_prompts, d.eval_prompts, seed=d.seed, config=arithmetic_config(cfg))
        return problem_records(train, "train"), problem_records(held_out, "eval")
    records = read_file(cfg, d.path, log=log)
    if d.eval_path:
        return records, read_file(cfg, d.eval_path, log=log, split=d.eval_split)[: d.eval_prompts]
    if len(records) <= d.eval_prompts:
        raise DataError(f"data.eval_prompts: {d.path} has {len(records)} rows, too few for {d.eval_prompts} held-out "
                        "prompts and a training set — lower data.eval_prompts or pass data.eval_path")
    return records[: -d.eval_prompts], records[-d.eval_prompts:]


def demonstration_file(cfg: RunConfig, run_dir: Path) -> Path | None:
    """The teacher/demonstration file of this run, writing the synthetic one if needed."""
    if cfg.data.demos:
        return Path(cfg.data.demos)
    if cfg.data.task != "arithmetic" or cfg.teacher.live_traces != "off":  # a live teacher writes them instead
        return None
    train, _ = make_splits(cfg.data.train_prompts, cfg.data.eval_prompts, seed=cfg.data.seed,
                           config=arithmetic_config(cfg))
    path = run_dir / "teacher.jsonl"
    if not path.exists():
        write_teacher_file(path, train, error_rate=0.0, seed=cfg.data.seed)
    return path


@dataclass
class DemoMatch:
    """How a teacher file's rows meet the training prompts (matched by question text): `demos` maps the
    prompt_index of each training prompt with a demonstration to its teacher row (0-based); `held_out`
    counts teacher rows whose question is a held-out prompt's; `strays` are the rows matching neither
    (0-based row, question); `without` the training prompts no row matches (prompt_index)."""

    rows: int
    prompts: int
    demos: dict[int, int]
    held_out: int
    strays: list[tuple[int, str]]
    without: list[int]

    @property
    def coverage(self) -> float:
        return len(self.demos) / self.prompts if self.prompts else 0.0

    def describe(self, source: str | Path, train: list[Record]) -> str:
        """The start-up line: counts, then a few examples of each kind of miss."""
        def show(q: str) -> str:
            q = " ".join(q.split())
            return repr(q if len(q) <= 40 else q[:39] + "…")

        line = (f"[data] {source}: {len(self.demos)} of {self.prompts} training prompts have a demonstration "
                f"({self.coverage:.0%}; the others are not trained)")
        if self.without:
            line += " — without: " + ", ".join(f"prompt {i} {show(train[i].question)}" for i in self.without[:3])
        line += f"; {len(self.strays)} of {self.rows} teacher rows match no prompt"
        if self.strays:
            line += " — " + ", ".join(f"row {r + 1} {show(q)}" for r, q in self.strays[:3])
        if self.held_out:
            line += f"; {self.held_out} match held-out prompts (not trained)"
        return line

    def problem(self, source: str | Path, min_match: float) -> str | None:
        """Why a file matching too little is refused (data.min_demo_match), or None."""
        if self.demos and self.coverage >= min_match:
            return None
        return (f"data.demos: {source}: {len(self.demos)} of the {self.prompts} training prompts have a "
                f"demonstration ({self.coverage:.0%}; {len(self.strays)} of its {self.rows} rows match no prompt, "
                f"by question text), below data.min_demo_match={min_match:g} — give the teacher file of the "
                f"training data, or accept the coverage with --set data.min_demo_match={self.coverage:.2f}")


def match_demos(records: list[Record], train: list[Record], held_out: list[Record] = ()) -> DemoMatch:
    """`DemoMatch` of teacher `records` against the `train` (and `held_out`) prompts. A question shared by
    several training prompts gives each the demonstration; of teacher rows sharing a question the last wins."""
    index_of: dict[str, list[int]] = {}
    for i, r in enumerate(train):
        index_of.setdefault(r.question, []).append(i)
    held = {r.question for r in held_out}
    demos, strays, on_held = {}, [], 0
    for row, rec in enumerate(records):
        if rec.question in index_of:
            demos.update(dict.fromkeys(index_of[rec.question], row))
        elif rec.question in held:
            on_held += 1
        else:
            strays.append((row, rec.question))
    return DemoMatch(len(records), len(train), demos, on_held, strays,
                     [i for i in range(len(train)) if i not in demos])


def tokenize_demos(records: list[Record], train: list[Record], tokenizer, source: Path,
                   match: DemoMatch | None = None) -> dict[int, np.ndarray]:
    """Demo ids (+eos) keyed by the prompt_index of the training prompt with the same question
    (`match`: `match_demos(records, train)` when already made)."""
    match = match or match_demos(records, train)
    if not match.demos:
        raise DataError(f"{source}: none of its {len(records)} demonstrations matches a training prompt "
                        f"(matched by question text; {len(match.strays)} unmatched)")
    demos = {}
    for i, row in match.demos.items():
        ids = tokenizer(records[row].target, add_special_tokens=False, verbose=False)["input_ids"]  # no too-long warning
        demos[i] = np.asarray([*ids, tokenizer.eos_token_id], dtype=np.int32)
    return demos


def score_demos(demos: dict[int, np.ndarray], train: list[Record], tokenizer,
                reward_fn: Callable[[str, str, str, dict], float]) -> dict[int, float]:
    """Reward of each demonstration, keyed like `demos` (prompt_index -> ids): `reward_fn(question, text,
    ground truth, extra)` with text = the ids decoded with special tokens skipped (the eos drops out) and
    the rest from training prompt `train[prompt_index]` -- what `actors.generate.GroupSampler` does with
    a generated row of that prompt. Scored DEMO_BATCH at a time (`tasks.rewards.score_all`): one call of a
    batched TRL-style reward each, whose time limit grows with the batch."""
    keys = list(demos)
    texts = tokenizer.batch_decode([demos[i].tolist() for i in keys], skip_special_tokens=True)
    rewards: list[float] = []
    for at in range(0, len(keys), DEMO_BATCH):
        rows = [train[i] for i in keys[at:at + DEMO_BATCH]]
        rewards += score_all(reward_fn, [r.question for r in rows], texts[at:at + DEMO_BATCH],
                             [r.ground_truth for r in rows], [{**r.extra_info, "data_source": r.data_source} for r in rows])
    return dict(zip(keys, rewards))


def too_long(what: str, skipped: int, total: int, cfg: RunConfig) -> str:
    """The start-up line about prompts skipped for length."""
    return (f"[data] {skipped} of {total} {what} prompts are longer than data.max_prompt_tokens="
            f"{cfg.data.max_prompt_tokens} tokens and are skipped — raise data.max_prompt_tokens to keep them")


def _file_demos(cfg: RunConfig, path: Path, train_recs: list[Record], eval_recs: list[Record], tokenizer,
                layout_log, log) -> dict[int, np.ndarray]:
    """A demonstration file's traces, tokenized, by the prompt_index of the training prompt each one answers
    (matched by question text; its start-up line said)."""
    records = read_file(cfg, path, require_target=True, log=layout_log)
    match = match_demos(records, train_recs, eval_recs)
    if log is not None:
        log(match.describe(path, train_recs))
    return tokenize_demos(records, train_recs, tokenizer, path, match)


def load_run_data(cfg: RunConfig, tokenizer, run_dir: Path, need_demos: bool,
                  reward_fn: Callable[[str, str, str, dict], float] | None = None,
                  log: Callable[[str], None] = print) -> RunData:
    """Prompts and (if `need_demos`) demonstrations with their rewards. reward_fn: the run's reward
    (default `tasks.rewards.scorer_for(cfg)`); log: where the start-up lines go (layouts, prompts skipped
    for length, the demonstration summary)."""
    train_recs, eval_recs = load_prompt_records(cfg, log)
    style = prompt_style(cfg)
    train, skipped = items_from_records(train_recs, tokenizer, cfg.data.max_prompt_tokens, style=style)
    held_out, eval_skipped = items_from_records(eval_recs, tokenizer, cfg.data.max_prompt_tokens, style=style)
    for what, n, total in (("training", len(skipped), len(train_recs)), ("held-out", len(eval_skipped), len(eval_recs))):
        if n:
            log(too_long(what, n, total, cfg))
    if not train:
        raise DataError(f"no training prompt fits data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    data = RunData(train, held_out, train_recs, skipped)
    live = cfg.teacher.live_traces != "off"  # a live teacher writes the traces the file lacks
    if need_demos:
        source = demonstration_file(cfg, run_dir)
        own = run_dir / TRACE_FILE  # a resumed run's own live traces: they count as given, never asked again
        own = own if live and own.is_file() else None
        if source is None and own is None and live:
            log("[data] no teacher file: every trace comes from the live teacher (teacher.live_traces)")
            return data
        if source is None:
            if own is None:
                raise DataError("this algorithm needs demonstrations: pass --demos FILE")
        else:
            said = cfg.data.demos and cfg.data.demos != cfg.data.path  # a file's layout is logged once
            data.demos = _file_demos(cfg, source, train_recs, eval_recs, tokenizer, log if said else None, log)
        if own is not None:  # a trace of this run replaces the file's, as it did before the stop
            traced = _file_demos(cfg, own, train_recs, eval_recs, tokenizer, None, None)
            log(f"[data] {own}: {len(traced)} traces this run's live teacher kept before it stopped; their prompts "
                "are not asked again")
            data.demos |= traced
            data.teacher_traced = set(traced)
            source = own if source is None else source
        scorer = scorer_for(cfg) if reward_fn is None else reward_fn
        try:
            data.demo_rewards = score_demos(data.demos, train_recs, tokenizer, scorer)
        finally:
            if reward_fn is None:
                scorer.close()
        data.demos_below_one = sum(r < 1.0 for r in data.demo_rewards.values())
        failed = scorer.stats() if reward_fn is None else {}
        errors = failed.get("reward_errors", 0) + failed.get("reward_timeouts", 0)
        log(f"[data] {data.demos_below_one} of {len(data.demos)} demonstrations from {source} score < 1 with the "
            "run's reward; their rows are trained with that score"
            + (f" ({errors} failed to score, first: {failed['reward_first_error']})" if errors else ""))
        data.train = with_demos([it for it in train if live or it.prompt_index in data.demos], data.demos)
        if not data.train:
            raise DataError(f"{source}: no training prompt has a demonstration")
    return data
