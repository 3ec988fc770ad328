"""Outcome rewards are plugins: `reward.fn` names a function ``fn(prompt, response, ground_truth, extra)
-> float`` that actors call on every generated response (and the driver on every demonstration).

Names:
- ``arithmetic``: 1.0 iff the last ``\\boxed{}`` of the response is an integer equal to the integer
  ground truth (`arithmetic` below). Runs in the caller's thread: it is pure and cannot hang.
- ``math_verify``: the last ``\\boxed{}`` equivalent to the ground truth -- integers compared exactly,
  anything else by math-verify (`tasks.math_worker.score`).
- ``module:function`` (an importable module) or ``path/to/file.py:function``: your own.
- unset (null): ``arithmetic`` for data.task=arithmetic, ``math_verify`` for data.task=file.

Arguments: prompt = the problem text (the last user message of the row's prompt); response = the
decoded response (special tokens skipped; a LUFFY guided row's teacher prefix included); ground_truth =
the row's ground truth (a string); extra = the row's ``extra_info`` dict plus its ``data_source``.

Every reward but ``arithmetic`` runs in a killable worker process (`tasks.worker.FunctionWorker`, the
isolation math-verify always had) under the per-call limit ``reward.timeout_s``. A call that raises,
returns something that is not a finite number, or whose worker dies scores 0 and counts as an error; a
call past the limit scores 0 and counts as a timeout (`Scorer.stats`: actors report them, the driver
logs ``reward/errors`` and ``reward/timeouts``); the first error's message is logged once per scorer.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tasks.boxed import last_boxed
from tasks.worker import FunctionWorker, WorkerError, WorkerTimeout, load_function

logger = logging.getLogger(__name__)

_INTEGER = re.compile(r"[+-]?\d+")


def arithmetic(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """1.0 iff the last ``\\boxed{}`` of `response` is an integer equal to `ground_truth` (an integer: any
    other ground truth raises, i.e. counts as an error -- the wrong reward for that dataset)."""
    pred = last_boxed(response)
    return float(pred is not None and _INTEGER.fullmatch(pred.strip()) is not None and int(pred) == int(ground_truth))


@dataclass(frozen=True)
class Builtin:
    """A named reward: `target` is its function's name (`tasks.worker.load_function`); `inline` = called in
    the caller's thread rather than in a worker process."""

    target: str
    inline: bool
    summary: str


BUILTINS = {
    "arithmetic": Builtin("tasks.rewards:arithmetic", True, "last \\boxed{} equals the integer ground truth"),
    "math_verify": Builtin("tasks.math_worker:score", False,
                           "last \\boxed{} equivalent to the ground truth by math-verify (integers exactly)"),
}
ARGUMENTS = ("prompt", "response", "ground_truth", "extra")


class RewardSpecError(ValueError):
    """`reward.fn` names nothing callable as fn(prompt, response, ground_truth, extra); one line."""


def reward_name(cfg) -> str:
    """`reward.fn`, or the default for `data.task` (module docstring)."""
    return cfg.reward.fn or ("arithmetic" if cfg.data.task == "arithmetic" else "math_verify")


def check_reward_fn(name: str) -> None:
    """Load `name` in this process and check it takes the four arguments; `RewardSpecError` if not."""
    if name in BUILTINS:
        return
    where = f"reward.fn={name}"
    try:
        fn = load_function(name)
    except ModuleNotFoundError as e:
        raise RewardSpecError(f"{where}: {e} — install it or put its folder on PYTHONPATH, or name the file: "
                              "reward.fn=path/to/file.py:function") from None
    except (ValueError, FileNotFoundError, AttributeError, TypeError) as e:
        raise RewardSpecError(f"{where}: {e}") from None
    except Exception as e:  # the module itself raised while being imported
        raise RewardSpecError(f"{where}: importing it raised {type(e).__name__}: {e}") from None
    try:
        inspect.signature(fn).bind(*ARGUMENTS)
    except TypeError:
        raise RewardSpecError(f"{where}: its parameters {inspect.signature(fn)} do not take the 4 arguments "
                              f"({', '.join(ARGUMENTS)})") from None
    except ValueError:  # no signature to inspect (some C functions): the first call will tell
        pass


class Scorer:
    """The run's reward as a callable (prompt, response, ground_truth, extra) -> float that never raises:
    failures score 0 and are counted (module docstring). Thread-safe."""

    def __init__(self, name: str, timeout_s: float = 5.0) -> None:
        self.name = name
        builtin = BUILTINS.get(name)
        target = builtin.target if builtin else name
        self._inline = load_function(target) if builtin and builtin.inline else None
        self._worker = None if self._inline else FunctionWorker(target, timeout_s)
        self.errors = self.timeouts = 0
        self.first_error: str | None = None
        self._lock = threading.Lock()

    def __call__(self, prompt: str, response: str, ground_truth: str, extra: dict | None = None) -> float:
        args = (prompt, response, ground_truth, extra or {})
        try:
            value = self._inline(*args) if self._inline else self._worker.call(*args)
            score = float(value)
            if not math.isfinite(score):
                raise ValueError(f"returned {value!r}, not a finite number")
            return score
        except WorkerTimeout:
            with self._lock:
                self.timeouts += 1
        except Exception as e:
            message = str(e) if isinstance(e, WorkerError) else f"{type(e).__name__}: {e}"
            with self._lock:
                self.errors += 1
                first = self.first_error is None
                if first:
                    self.first_error = message
            if first:
                logger.warning("reward %s failed, scored 0 (later failures are only counted): %s", self.name, message)
        return 0.0

    def stats(self) -> dict:
        """Counts so far: reward_errors, reward_timeouts, and reward_first_error (message or None)."""
        return {"reward_errors": self.errors, "reward_timeouts": self.timeouts, "reward_first_error": self.first_error}

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


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
