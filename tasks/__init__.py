"""Tasks and data: the synthetic arithmetic task, its step checker, verifiable rewards, dataset
loaders/writers and the tiny default model. See tasks/README.md for usage.

Only light imports here (no torch, no transformers): actors and the buffer import this package.
"""

from tasks.arithmetic import ArithmeticConfig, Problem, make_splits, sample_problems
from tasks.demos import demonstration_records, problem_records, write_teacher_file
from tasks.hendrycks import hendrycks_score
from tasks.loaders import MATH500_FIELDS, load_records
from tasks.math_answers import MathVerifier, math_reward
from tasks.outcome import reward
from tasks.records import DataError, Record, write_records
from tasks.step_checker import score_steps, split_steps
from tasks.tiny_model import build_tiny_model

__all__ = [
    "ArithmeticConfig",
    "DataError",
    "MATH500_FIELDS",
    "MathVerifier",
    "Problem",
    "Record",
    "build_tiny_model",
    "demonstration_records",
    "hendrycks_score",
    "load_records",
    "make_splits",
    "math_reward",
    "problem_records",
    "reward",
    "sample_problems",
    "score_steps",
    "split_steps",
    "write_records",
    "write_teacher_file",
]
