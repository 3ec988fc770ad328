"""Outcome rewards are plugins: `reward.fn` names the function actors call on every generated response
(and the driver on every demonstration). Its parameter *names* say how it is called: three shapes, ours
and the field's two, told apart from the signature before anything starts (`shape_of`, through
`check_reward_fn` in preflight):

- ours, ``fn(prompt, response, ground_truth, extra) -> float``, one response a call: prompt = the problem
  text (the last user message of the row's prompt); response = the decoded response (special tokens
  skipped; a LUFFY guided row's teacher prefix included); ground_truth = the row's ground truth (a
  string); extra = the row's ``extra_info`` dict plus its ``data_source``.
- veRL, ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, one response a call,
  with these four keywords as veRL's reward manager passes them: data_source = the row's data_source;
  solution_str = the response (as above); ground_truth as above; extra_info = the row's ``extra_info``
  dict. It returns a number or, as veRL allows, a dict whose ``"score"`` is the number (other keys are
  ignored).
- TRL, ``fn(prompts, completions, **kwargs) -> list[float]``, batched, called with keywords as TRL's
  GRPOTrainer calls it: prompts = the problem texts; completions = the responses as plain strings (TRL's
  standard format, not its conversational ``[{"role": "assistant", "content": ...}]``); then the rows'
  columns, each a list with one entry per completion: ``ground_truth``, ``data_source`` and every key of
  ``extra_info`` (None where a row lacks it). TRL's ``completion_ids`` and ``trainer_state`` are not
  passed. A parameter other than prompts and completions with no default must be one of these columns
  (checked at start against the data: `data_columns`). It returns one reward per completion; None (TRL's
  "no reward", which TRL sums to 0) scores 0 and counts as an error here, where it is the only reward.
  One call scores a whole group (an actor's n responses to a prompt, `algo-train eval`'s K samples of
  one) and the driver's demonstrations a batch at a time; an actor's held-out evaluation scores each
  response alone (one-element lists).

A function fits a shape when it names the shape's own parameter (response, solution_str, completions)
and takes all of the shape's keywords (a TRL one also ``**kwargs``, as TRL requires); one that fits none
is refused in one line naming the three. Only names count -- ``fn(p, r, gt, ex)`` is refused -- since
binding by position is what handed a veRL function the prompt as its data_source. The function's module
is imported once in each scoring process, to read the signature.

Names:
- ``arithmetic``: 1.0 iff the last ``\\boxed{}`` of the response is an integer equal to the integer
  ground truth (`arithmetic` below). Runs in the caller's thread: it is pure and cannot hang.
- ``math_verify``: the last ``\\boxed{}`` equivalent to the ground truth -- integers compared exactly,
  anything else by math-verify (`tasks.math_worker.score`).
- ``module:function`` (an importable module) or ``path/to/file.py:function``: your own.
- unset (null): ``arithmetic`` for data.task=arithmetic, ``math_verify`` for data.task=file.
The two built-ins have our shape.

Every reward but ``arithmetic`` runs in a killable worker process (`tasks.worker.FunctionWorker`, the
isolation math-verify always had) under the limit ``reward.timeout_s`` per response (k times it for a
batched call of k). A response whose call raises, returns something that is not a finite number (nor a
dict with one as "score"), or whose worker dies scores 0 and counts as an error; past the limit it scores
0 and counts as a timeout (`Scorer.stats`: actors report them, the driver logs ``reward/errors`` and
``reward/timeouts``). Counts are of responses: a batched call that fails counts each of its k. The first
error's message, and the first timeout, are logged once per scorer. A reward that hangs is therefore never a
wedge: it costs its group at most the limit per response (and the worker's restart).
"""

from __future__ import annotations

import inspect
import logging
import math
import re
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from tasks.boxed import last_boxed
from tasks.worker import FunctionWorker, WorkerError, WorkerTimeout, load_function, load_plugin

logger = logging.getLogger(__name__)

_INTEGER = re.compile(r"[+-]?\d+")


def arithmetic(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """1.0 iff the last ``\\boxed{}`` of `response` is an integer equal to `ground_truth` (an integer: any
    other ground truth raises, i.e. counts as an error -- the wrong reward for that dataset)."""
    pred = last_boxed(response)
    return float(pred is not None and _INTEGER.fullmatch(pred.strip()) is not None and int(pred) == int(ground_truth))


@dataclass(frozen=True)
class Builtin:
    """A named reward, of our shape: `target` is its function's name (`tasks.worker.load_function`);
    `inline` = called in the caller's thread rather than in a worker process."""

    target: str
    inline: bool
    summary: str


BUILTINS = {
    "arithmetic": Builtin("tasks.rewards:arithmetic", True, "last \\boxed{} equals the integer ground truth"),
    "math_verify": Builtin("tasks.math_worker:score", False,
                           "last \\boxed{} equivalent to the ground truth by math-verify (integers exactly)"),
}


class RewardSpecError(ValueError):
    """`reward.fn` names nothing callable in one of the accepted shapes (module docstring); one line."""


def _ours(prompt, response, ground_truth, extra) -> dict:
    return {"prompt": prompt, "response": response, "ground_truth": ground_truth, "extra": extra}


def _verl(prompt, response, ground_truth, extra) -> dict:
    return {"data_source": extra.get("data_source", ""), "solution_str": response, "ground_truth": ground_truth,
            "extra_info": {k: v for k, v in extra.items() if k != "data_source"}}


def _trl(prompts, responses, ground_truths, extras) -> dict:
    columns = dict.fromkeys(k for e in extras for k in e if k not in ("prompts", "completions", "ground_truth"))
    return {"prompts": list(prompts), "completions": list(responses), "ground_truth": list(ground_truths),
            **{k: [e.get(k) for e in extras] for k in columns}}


@dataclass(frozen=True)
class Shape:
    """An accepted signature (module docstring): `own` is the parameter that names it; `keywords(prompt(s),
    response(s), ground truth(s), extra(s))` are the keyword arguments of one call -- lists when `batched`."""

    name: str
    own: str
    keywords: Callable[..., dict]
    batched: bool
    usage: str


SHAPES = (
    Shape("ours", "response", _ours, False, "fn(prompt, response, ground_truth, extra) -> float"),
    Shape("veRL", "solution_str", _verl, False,
          "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float or {'score': float}"),
    Shape("TRL", "completions", _trl, True, "fn(prompts, completions, **kwargs) -> list[float] (batched)"),
)


def shape_of(fn: Callable, where: str) -> Shape:
    """The first of `SHAPES` that `fn`'s parameter names fit; `RewardSpecError` naming all three if none.
    where: the message's prefix (``reward.fn=NAME``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some C functions
        raise RewardSpecError(f"{where}: its signature cannot be read — wrap it in a Python function") from None
    named = {p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for shape in SHAPES:
        if shape.own not in named or (shape.batched and not any_keyword):
            continue
        keywords = shape.keywords([], [], [], []) if shape.batched else shape.keywords("", "", "", {})
        try:  # a batched function's other parameters are columns, known only with the data (`check_reward_fn`)
            (sig.bind_partial if shape.batched else sig.bind)(**keywords)
        except TypeError:
            continue
        return shape
    raise RewardSpecError(f"{where}: its parameters {sig} fit none of the accepted shapes — "
                          + "; ".join(f"{s.name}: {s.usage}" for s in SHAPES) + " (parameters are bound by name)")


def data_columns(records: Iterable) -> set[str]:
    """The column keywords a TRL-shaped reward gets on every row of `records` (`tasks.records.Record`):
    ground_truth, data_source and the extra_info keys all rows have."""
    keys = [set(r.extra_info) for r in records]
    common = set.intersection(*keys) if keys else set()
    return {"ground_truth", "data_source"} | (common - {"prompts", "completions"})


def reward_name(cfg) -> str:
    """`reward.fn`, or the default for `data.task` (module docstring)."""
    return cfg.reward.fn or ("arithmetic" if cfg.data.task == "arithmetic" else "math_verify")


def check_reward_fn(name: str, columns: Collection[str] | None = None) -> None:
    """Load `name` in this process and check its signature fits a shape -- for a TRL one, with `columns`
    (`data_columns` of the run's rows) given, that each parameter without a default is a column;
    `RewardSpecError` if not."""
    if name in BUILTINS:
        return
    where = f"reward.fn={name}"
    fn = load_plugin(name, where, RewardSpecError, "reward.fn=path/to/file.py:function")
    shape = shape_of(fn, where)
    if shape.batched and columns is not None:
        params = inspect.signature(fn).parameters.values()
        missing = [p.name for p in params if p.default is p.empty and p.name not in ("prompts", "completions")
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in columns]
        if missing:
            raise RewardSpecError(f"{where}: its parameter {missing[0]!r} is not a column of the data (each call "
                                  f"passes {', '.join(sorted(columns))}) — use one of these, or give it a default")


def _number(value) -> float:
    """A reward as a float: a finite number, or a dict's finite "score" (veRL); ValueError otherwise."""
    if isinstance(value, dict) and "score" not in value:
        raise ValueError(f"returned a dict without 'score' (keys: {', '.join(map(str, value))})")
    score = value["score"] if isinstance(value, dict) else value
    if not isinstance(score, int | float) or not math.isfinite(score):
        raise ValueError(f"returned {value!r}, not a finite number")
    return float(score)


class Scorer:
    """The run's reward (`shape`: how its function is called) as callables that never raise: failures
    score 0 and are counted (module docstring). Thread-safe."""

    def __init__(self, name: str, timeout_s: float = 5.0) -> None:
        self.name, self.timeout_s = name, timeout_s
        builtin = BUILTINS.get(name)
        target = builtin.target if builtin else name
        self._inline = load_function(target) if builtin and builtin.inline else None
        self.shape = SHAPES[0] if builtin else shape_of(load_function(target), f"reward.fn={name}")
        self._worker = None if self._inline else FunctionWorker(target, timeout_s)
        self.errors = self.timeouts = 0
        self.first_error: str | None = None
        self._lock = threading.Lock()

    def __call__(self, prompt: str, response: str, ground_truth: str, extra: dict | None = None) -> float:
        """The reward of one response (a batched function gets one-element lists)."""
        return self.batch([prompt], [response], [ground_truth], [extra or {}])[0]

    def batch(self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[str],
              extras: Sequence[dict]) -> list[float]:
        """The rewards of responses[i] to prompts[i] (with ground_truths[i], extras[i]): one call of a
        batched function, else one call per response."""
        if self.shape.batched and responses:
            return self._scores(self.shape.keywords(prompts, responses, ground_truths, extras), len(responses))
        return [self._scores(self.shape.keywords(*row), 1)[0]
                for row in zip(prompts, responses, ground_truths, extras)]

    def _scores(self, keywords: dict, n: int) -> list[float]:
        """The n rewards of one call with `keywords`; failures scored 0 and counted per response."""
        try:
            value = (self._inline(**keywords) if self._inline
                     else self._worker.call(kwargs=keywords, timeout_s=self.timeout_s * n))
            if not self.shape.batched:
                value = [value]
            elif not isinstance(value, list) or len(value) != n:
                raise ValueError(f"returned {type(value).__name__} {str(value)[:80]}, not a list of {n} rewards")
        except WorkerTimeout as e:
            with self._lock:
                first, self.timeouts = self.timeouts == 0, self.timeouts + n
            if first:  # a hang is a timeout: the worker was killed and the caller goes on
                logger.warning("reward %s timed out, scored 0 (reward/timeouts; later ones are only counted): %s",
                               self.name, e)
            return [0.0] * n
        except Exception as e:
            self._failed(n, str(e) if isinstance(e, WorkerError) else f"{type(e).__name__}: {e}")
            return [0.0] * n
        scores = []
        for i, v in enumerate(value):
            try:
                scores.append(_number(v))
            except ValueError as e:
                self._failed(1, f"ValueError: {e}" + (f" (completion {i} of {n})" if self.shape.batched else ""))
                scores.append(0.0)
        return scores

    def _failed(self, n: int, message: str) -> None:
        with self._lock:
            self.errors += n
            first = self.first_error is None
            if first:
                self.first_error = message
        if first:
            logger.warning("reward %s failed, scored 0 (later failures are only counted): %s", self.name, message)

    def stats(self) -> dict:
        """Counts so far: reward_errors, reward_timeouts, and reward_first_error (message or None)."""
        return {"reward_errors": self.errors, "reward_timeouts": self.timeouts, "reward_first_error": self.first_error}

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def score_all(reward_fn, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[str],
              extras: Sequence[dict]) -> list[float]:
    """The rewards of a batch: `Scorer.batch` for a `Scorer`; any other callable (prompt, response,
    ground_truth, extra) -> float (a test's stand-in) is called once per response."""
    if isinstance(reward_fn, Scorer):
        return reward_fn.batch(prompts, responses, ground_truths, extras)
    return [float(reward_fn(*row)) for row in zip(prompts, responses, ground_truths, extras)]


def scorer_for(cfg) -> Scorer:
    """The `Scorer` of a run's config (`reward.fn`, `reward.timeout_s`)."""
    return Scorer(reward_name(cfg), cfg.reward.timeout_s)


def reward_metrics(reports: Iterable[dict]) -> dict:
    """``reward/errors`` and ``reward/timeouts`` summed over actor stats (`Scorer.stats` keys)."""
    reports = list(reports)
    return {"reward/errors": sum(r.get("reward_errors", 0) for r in reports),
            "reward/timeouts": sum(r.get("reward_timeouts", 0) for r in reports)}


def first_error(reports: Iterable[dict]) -> str | None:
    """The first reported reward error message among actor stats, or None."""
    return next((r["reward_first_error"] for r in reports if r.get("reward_first_error")), None)
