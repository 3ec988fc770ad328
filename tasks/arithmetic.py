"""Synthetic verifiable arithmetic: the task of the embedded, laptop-sized default.

Why this task: RL on a CPU needs answers that can be checked exactly, worked solutions whose steps a
rule can judge (PURE's process reward without a PRM, see `tasks.step_checker`), a difficulty knob, and
solutions short enough for a tiny character-level model (a few dozen characters).

A problem is ``a op b`` with op in ``+ - *``. Its prompt is ``"What is 457+386?"`` and its reference
solution works column by column, one step per column, steps separated by "\\n\\n" and the last step
is the final answer in ``\\boxed{...}`` (the convention of `tasks.outcome`):

* ``+`` (units column first; ``x+y+c=s`` with carry-in c, then the digits written so far; the last
  column writes its whole sum)::

      7+6+0=13, 3 | 5+8+1=14, 43 | 4+3+1=8, 843 | \\boxed{843}

* ``-`` (a >= b; a column that borrows shows its top digit plus 10, the next one subtracts the
  borrow; the digits written so far keep leading zeros, the answer drops them)::

      13-7-0=6, 6 | 12-8-1=3, 36 | 5-1-1=3, 336 | \\boxed{336}         (523-187)

* ``*`` (one partial product per non-zero digit of b, each added to the running total)::

      457*8=3656 | 457*30=13710 | 3656+13710=17366 | \\boxed{17366}   (457*38)

`solve` can inject one fault (a wrong digit or a wrong carry/borrow) that later steps carry forward
consistently, as a person's slip would; `tasks.demos` uses it for noisy SFT demonstrations. A fault
always changes the final answer (each one shifts the result by a non-zero multiple of a power of 10).

Difficulty levels (`LEVELS`, chosen with ``data.arithmetic.level``): named configs of the step-by-step
testbed (`launch.prep.testbed`). ``steps-main`` (4-5 digit + and -: 5-6 checkable steps, column steps then
the box) is the level its warm model is trained on; ``steps-hard`` (7-8 digits: 8-9 steps) has columns the
warm model never wrote, so it sits beyond it. More columns rather than chained operations or multi-digit
``*``: a column step is the same small skill at every length, so the levels differ in length and
positions only, and the step checker judges them unchanged.

Train and eval splits are disjoint by construction: whether a problem is held out is a property of the
problem itself (a stable hash), not of the seed, so no train set from any seed meets any eval set.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from functools import cached_property

OPS = ("+", "-", "*")
PROMPT_RE = re.compile(r"What is (\d+)([+\-*])(\d+)\?")


@dataclass(frozen=True)
class ArithmeticConfig:
    """Difficulty of the generated problems.

    ops: operators to draw from. min_digits/max_digits: digit counts of a and b (drawn independently,
    uniformly). mul_max_digits: cap on the digits of b for ``*``. eval_fraction: share of the problem
    space held out for evaluation.
    """

    ops: tuple[str, ...] = ("+", "-")
    min_digits: int = 1
    max_digits: int = 3
    mul_max_digits: int = 1
    eval_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty subset of {OPS}, got {self.ops!r}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}")
        if self.mul_max_digits < 1:
            raise ValueError(f"mul_max_digits must be >= 1, got {self.mul_max_digits}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")


LEVELS: dict[str, ArithmeticConfig] = {
    "steps-main": ArithmeticConfig(ops=("+", "-"), min_digits=4, max_digits=5),
    "steps-hard": ArithmeticConfig(ops=("+", "-"), min_digits=7, max_digits=8),
}


def level_config(name: str) -> ArithmeticConfig:
    """The `ArithmeticConfig` of level `name` (module docstring); ValueError naming the levels otherwise."""
    if name not in LEVELS:
        raise ValueError(f"unknown arithmetic level {name!r}; choose one of {', '.join(LEVELS)}")
    return LEVELS[name]


@dataclass(frozen=True)
class Fault:
    """One injected error. step: index of the column (or, for ``*``, of the step) it hits.

    kind ``digit``: that step's result is off by ``delta`` (+1 or -1) in its lowest written digit.
    kind ``carry``: the carry (borrow) leaving that column is flipped, so the next column is wrong.
    """

    step: int
    kind: str
    delta: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("digit", "carry") or self.delta not in (1, -1) or self.step < 0:
            raise ValueError(f"bad fault {self}: kind must be 'digit'/'carry', delta +1/-1, step >= 0")


@dataclass(frozen=True)
class Problem:
    """``a op b``; prompt, exact answer, reference steps and solution are derived from these."""

    a: int
    op: str
    b: int

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {self.op!r}")
        if self.a < 0 or self.b < 0 or (self.op == "-" and self.a < self.b):
            raise ValueError(
                f"need 0 <= b <= a for '-' and non-negative operands, got {self.a}{self.op}{self.b}"
            )

    @property
    def prompt(self) -> str:
        return f"What is {self.a}{self.op}{self.b}?"

    @property
    def value(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def answer(self) -> str:
        return str(self.value)

    @cached_property
    def steps(self) -> tuple[str, ...]:
        """Reference steps; the last one is ``\\boxed{answer}``."""
        return solve(self)

    @property
    def solution(self) -> str:
        return "\n\n".join(self.steps)

    @classmethod
    def from_prompt(cls, text: str) -> Problem:
        """Recover the problem from a prompt (the last ``What is a op b?`` in `text`, so a chat-templated
        prompt works too)."""
        matches = PROMPT_RE.findall(text)
        if not matches:
            raise ValueError(f"no 'What is <a><op><b>?' question in prompt {text[:80]!r}")
        a, op, b = matches[-1]
        return cls(int(a), op, int(b))


def _digits(n: int) -> list[int]:
    """Decimal digits of n, units first."""
    return [int(ch) for ch in reversed(str(n))]


def _column_steps(p: Problem, fault: Fault | None) -> tuple[list[str], int]:
    """Column steps for ``+``/``-`` and the value the (possibly faulty) written digits spell."""
    xs, ys = _digits(p.a), _digits(p.b)
    n = max(len(xs), len(ys))
    xs, ys = xs + [0] * (n - len(xs)), ys + [0] * (n - len(ys))
    carry, written, steps = 0, "", []
    for k, (x, y) in enumerate(zip(xs, ys)):
        hit = fault is not None and fault.step == k
        if p.op == "+":
            s = x + y + carry
            if hit and fault.kind == "digit":
                s = s + fault.delta if s + fault.delta >= 0 else s + 1
            written = (str(s) if k == n - 1 else str(s % 10)) + written
            steps.append(f"{x}+{y}+{carry}={s}, {written}")
            carry = s // 10
        else:
            borrow = int(x - y - carry < 0)
            top = x + 10 * borrow
            d = top - y - carry
            if hit and fault.kind == "digit":
                d = (d + fault.delta) % 10
            written = str(d) + written
            steps.append(f"{top}-{y}-{carry}={d}, {written}")
            carry = borrow
        if hit and fault.kind == "carry":
            carry = 1 - carry
    return steps, int(written)


def _multiply_steps(p: Problem, fault: Fault | None) -> tuple[list[str], int]:
    """Partial products of a by each non-zero digit of b, each added to the running total."""
    steps: list[str] = []
    total: int | None = None

    def claim(value: int, place: int) -> int:
        if fault is not None and fault.step == len(steps):
            shifted = value + fault.delta * 10**place
            return shifted if shifted >= 0 else value + 10**place
        return value

    for j, d in enumerate(_digits(p.b)):
        if d == 0 and p.b != 0:
            continue
        m = d * 10**j
        part = claim(p.a * m, j)
        steps.append(f"{p.a}*{m}={part}")
        if total is None:
            total = part
        else:
            s = claim(total + part, 0)
            steps.append(f"{total}+{part}={s}")
            total = s
    assert total is not None
    return steps, total


def solve(problem: Problem, fault: Fault | None = None) -> tuple[str, ...]:
    """Worked steps of `problem` (last step ``\\boxed{N}``), with `fault` injected if given."""
    if problem.op == "*":
        steps, value = _multiply_steps(problem, fault)
    else:
        steps, value = _column_steps(problem, fault)
    if fault is not None and not (
        fault.step < len(steps) - (fault.kind == "carry") and (fault.kind == "digit" or problem.op != "*")
    ):
        raise ValueError(f"{fault} does not fit the {len(steps)} work steps of {problem.prompt!r}")
    return (*steps, f"\\boxed{{{value}}}")


def random_fault(problem: Problem, rng: random.Random) -> Fault:
    """A uniformly placed fault; ``carry`` faults only where a next column exists to receive them."""
    n_work = len(problem.steps) - 1
    step = rng.randrange(n_work)
    delta = rng.choice((1, -1))
    if problem.op != "*" and step < n_work - 1 and rng.random() < 0.5:
        return Fault(step, "carry", delta)
    return Fault(step, "digit", delta)


def is_eval_problem(problem: Problem, eval_fraction: float) -> bool:
    """Stable (seed-independent) membership of the held-out split."""
    h = hashlib.blake2b(f"{problem.a}{problem.op}{problem.b}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < eval_fraction


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def random_problem(rng: random.Random, config: ArithmeticConfig) -> Problem:
    """One problem drawn from `config` (any split)."""
    op = rng.choice(config.ops)
    a = _operand(rng, rng.randint(config.min_digits, config.max_digits))
    b_max = min(config.max_digits, config.mul_max_digits) if op == "*" else config.max_digits
    b = _operand(rng, rng.randint(min(config.min_digits, b_max), b_max))
    if op == "-" and a < b:
        a, b = b, a
    return Problem(a, op, b)


def sample_problems(
    n: int, *, split: str, seed: int, config: ArithmeticConfig | None = None
) -> list[Problem]:
    """`n` distinct problems of `split` ("train" or "eval"), deterministic in `seed`.

    Raises ValueError when the split's problem space is too small for `n` distinct problems.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    config = config or ArithmeticConfig()
    rng = random.Random(f"{seed}:{split}")
    want_eval = split == "eval"
    seen: set[Problem] = set()
    out: list[Problem] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 10_000:
            raise ValueError(f"only {len(out)} distinct {split} problems found for n={n} with {config}")
        p = random_problem(rng, config)
        if p not in seen and is_eval_problem(p, config.eval_fraction) == want_eval:
            seen.add(p)
            out.append(p)
    return out


def make_splits(
    n_train: int, n_eval: int, *, seed: int = 0, config: ArithmeticConfig | None = None
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint (train, eval) problem lists, deterministic in `seed`."""
    return (
        sample_problems(n_train, split="train", seed=seed, config=config),
        sample_problems(n_eval, split="eval", seed=seed, config=config),
    )
