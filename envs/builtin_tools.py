"""The built-in tools a policy may call: `calculator` and `python`, as plain functions returning the observation.

A tool is a plain Python function with a typed signature and a docstring (what the model is shown), returning
a str. Neither raises on the model's input: a refusal or a limit comes back as a short "error: ..." text.

    calculator(expression: str) -> str   exact rational arithmetic (envs/calculator.py)
    python_tool(limits) -> python        a function `python(code: str) -> str` running the code in the sandbox
    BUILTIN_TOOLS                        {"calculator": calculator, "python": python with SandboxLimits()}
"""

from __future__ import annotations

from collections.abc import Callable

from envs.calculator import CalculatorError, evaluate, format_number
from envs.sandbox import Sandbox, SandboxLimits


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Integers and fractions are exact: 1/3 + 1/6 gives 1/2, big integers keep every digit. Supports
    + - * / // % ** and parentheses; decimals such as 0.25 are read exactly. A non-integer result is
    written as numerator/denominator.

    Args:
        expression: the expression to evaluate, for example "(1234567 * 7654321) // 3".
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as e:
        return f"error: {e}"


def python_tool(limits: SandboxLimits | None = None, sandbox: Sandbox | None = None) -> Callable[[str], str]:
    """A tool named `python` that runs a Python 3 program in the sandbox (limits: SandboxLimits() by default,
    or those of the given `sandbox`). The sandbox's mode is decided at the first call, not here."""
    box = sandbox or Sandbox(limits)
    lim = box.limits

    def python(code: str) -> str:
        return box.run(code).observation()

    python.__doc__ = f"""Run a Python 3 program and return what it printed (stdout and stderr).

        Each call starts a fresh interpreter: nothing is kept between calls, so print every value you need.
        There is no network access. Limits: {lim.cpu_s} s of CPU time, {lim.wall_s:g} s of wall time,
        {lim.memory_mb} MB of memory, {lim.output_bytes} bytes of output; a program over a limit is stopped
        and the reply ends with a line starting "error:". An uncaught exception returns its traceback.

        Args:
            code: the complete Python 3 program to run.
        """
    return python


BUILTIN_TOOLS: dict[str, Callable[[str], str]] = {"calculator": calculator, "python": python_tool()}
