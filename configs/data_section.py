"""The `data:` section: where prompts (and demonstrations) come from, which columns hold what, and how a
prompt becomes the tokens every role sees (system prompt, chat template or raw text).

Data sources (`tasks.loaders`): a ``.jsonl`` / ``.json`` (an array of rows, or JSON lines) / ``.parquet``
file, or ``hf://NAME[:CONFIG]``, a Hub dataset read through the optional `datasets` package
(`datasets.load_dataset(NAME, CONFIG, split=...)`, from its cache when it is there) with the split named by
`data.split` (training prompts, demonstrations) or `data.eval_split` (held-out prompts).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from configs.base import Section
from tasks.arithmetic import LEVELS


def is_template_file(value: str) -> bool:
    """data.chat_template names a file (read at start) rather than holding the template's text."""
    return value.endswith(".jinja")


class ArithmeticTaskConfig(Section):
    min_digits: int = Field(1, ge=1, description="digits of the smallest operand")
    max_digits: int = Field(2, ge=1, description="digits of the largest operand")
    ops: list[Literal["+", "-", "*"]] = Field(["+", "-"], description="operators to draw from")
    level: Literal[tuple(LEVELS)] | None = Field(
        None, description="a named difficulty (tasks.arithmetic.LEVELS): steps-main = 4-5 digit +/- (5-6 checkable "
                          "steps, the level of `--testbed steps`), steps-hard = 7-8 digits (8-9 steps, beyond its "
                          "warm model); it sets min_digits, max_digits and ops, which may then only repeat its "
                          "values; null = those keys as given")

    @model_validator(mode="before")
    @classmethod
    def _level_sets_digits(cls, data):
        """A level fills min_digits/max_digits/ops; a different value given beside it is refused by name (which
        of the two the user meant cannot be guessed)."""
        level = LEVELS.get(data.get("level")) if isinstance(data, dict) and isinstance(data.get("level"), str) else None
        if level is None:  # no level, or an unknown one (the Literal refuses it, listing the levels)
            return data
        values = {"min_digits": level.min_digits, "max_digits": level.max_digits, "ops": list(level.ops)}
        for key, value in values.items():
            given = data.get(key, value)
            if (sorted(given) != sorted(value)) if key == "ops" and isinstance(given, list | tuple) else given != value:
                raise ValueError(f"level {data['level']} sets {key} to {value}, and {key} is given as {given} — "
                                 f"drop data.arithmetic.{key} or data.arithmetic.level")
        return {**data, **values}


class DataFieldsConfig(Section):
    """Which column of a data file holds what (`tasks.loaders`); null = from the layout recognised in the
    file (veRL, problem/answer/solution, question/answer). Applies to data.path, data.eval_path, data.demos."""

    prompt: str | None = Field(
        None, description="column of the prompt: a string or a chat list of {role, content}; dotted paths reach "
                          "into nested objects (e.g. extra_info.question)")
    answer: str | None = Field(
        None, description="column of the ground truth the reward compares the response's final \\boxed{} "
                          "answer with (a string or a number)")
    solution: str | None = Field(
        None, description="column of the demonstration (LUFFY teacher trace, SFT target): a string or a list "
                          "with one assistant message; read only from data.demos")


class DataConfig(Section):
    task: Literal["arithmetic", "file"] = Field("arithmetic", description="synthetic task or a dataset file")
    path: str | None = Field(None, description="training prompts when task=file: a .jsonl, .json (array of rows) "
                                               "or .parquet file, or hf://NAME[:CONFIG] (a Hub dataset, needs `pip "
                                               "install datasets`), in the veRL, problem/answer/solution or "
                                               "question/answer (GSM8K) layout (see data.fields)")
    eval_path: str | None = Field(None, description="held-out prompts (a file or hf://NAME[:CONFIG], as data.path); "
                                                    "default: the last data.eval_prompts rows of data.path, or a "
                                                    "split of the synthetic task")
    split: str = Field("train", description="split of a Hub dataset (hf://) read for data.path and data.demos")
    eval_split: str = Field("test", description="split of a Hub dataset (hf://) read for data.eval_path")
    demos: str | None = Field(None, description="teacher/demonstration trajectories (parquet/JSONL with a `target` "
                                                "or `solution` column, or data.fields.solution) "
                                                "for LUFFY and SFT; null with the synthetic task = generate them")
    min_demo_match: float = Field(
        0.5, ge=0, le=1, description="least share of the training prompts that data.demos must give a demonstration "
                                     "(matched by question text; the prompts without one are not trained); a teacher "
                                     "file matching less is refused at start")
    fields: DataFieldsConfig = Field(DataFieldsConfig(), description="which columns of the data files hold "
                                     "prompt, answer and solution (null = recognised from the file's layout)")
    prompt_format: Literal["chat", "raw"] = Field(
        "chat", description="chat = a prompt's messages go through the chat template (data.chat_template, else the "
                            "tokenizer's); raw = its text is tokenised as is (the contents of its messages joined by "
                            "a blank line), for base models and prompts written out in full. Training, held-out "
                            "evaluation and `algo-train eval` use the same prompt tokens")
    system_prompt: str | None = Field(
        None, description="text put before every prompt as a system message (raw: as the first paragraph); a row "
                          "whose prompt starts with a system message keeps its own; null = none")
    chat_template: str | None = Field(
        None, description="Jinja chat template used instead of the tokenizer's (data.prompt_format=chat): the "
                          "template text, or the path of a .jinja file read at start; null = the tokenizer's")
    arithmetic: ArithmeticTaskConfig = Field(ArithmeticTaskConfig(), description="the synthetic task (data.task=arithmetic)")
    train_prompts: int = Field(10000, gt=0, description="synthetic train prompts to generate")
    eval_prompts: int = Field(200, gt=0, description="held-out prompts used by each evaluation")
    max_prompt_tokens: int = Field(
        256, gt=0, description="prompt limit, tokens after the chat template: a longer prompt is skipped (never cut) "
                               "and counted at start. 256 suits the synthetic task; raise it for real datasets. "
                               "Engines hold max_prompt_tokens + rollout.max_response_tokens tokens of context")
    seed: int = Field(0, description="data generation / shuffling seed")

    @field_validator("chat_template")
    @classmethod
    def _template_or_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if info.data.get("prompt_format") == "raw":
            raise ValueError("set, but data.prompt_format=raw uses no template — drop one of the two")
        if not is_template_file(value) and "{{" not in value and "{%" not in value:
            raise ValueError(f"{value!r:.60} is neither a .jinja file nor Jinja template text (no {{{{ or {{%) — "
                             "give the template or the path of a .jinja file")
        return value
