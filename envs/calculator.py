"""The exact calculator tool: rational arithmetic on integers and fractions, parsed with `ast`, never `eval`.

Every value is an `int` or a `fractions.Fraction`, so 1/3 + 1/6 is exactly 1/2 and big integers stay exact.
A decimal literal is read from its text (0.1 is 1/10, not the nearest float). Sizes are bounded so that no
expression can hang or exhaust memory: the input is at most `MAX_CHARS` characters, and every intermediate
value — numerator and denominator — has at most `MAX_BITS` bits; a power whose result would exceed that is
refused before it is computed (2**10**10 is refused in microseconds).
"""

from __future__ import annotations

import ast
import operator
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_CHARS = 2000  # characters of one expression
MAX_BITS = 10_000  # bits of any numerator or denominator (about 3010 decimal digits)
MAX_LITERAL_EXPONENT = 1000  # |e| of a decimal literal such as 1e1000

Number = int | Fraction

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: Fraction,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model sees after "error: "."""


def _bits(x: Number) -> int:
    if isinstance(x, int):
        return x.bit_length()
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _checked(x: Number) -> Number:
    if isinstance(x, Fraction) and x.denominator == 1:
        x = x.numerator
    if _bits(x) > MAX_BITS:
        raise CalculatorError(f"result too large (over {MAX_BITS} bits)")
    return x


def _power(base: Number, exponent: Number) -> Number:
    if not (isinstance(exponent, int) or exponent.denominator == 1):
        raise CalculatorError("only integer exponents are supported (exact arithmetic)")
    exponent = int(exponent)
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    if base in (0, 1, -1):
        return base ** abs(exponent) if base != -1 else (-1) ** (abs(exponent) % 2)
    # |base**e| needs about bits(base) * |e| bits; refuse before computing anything that large.
    if (_bits(base) - 1) * abs(exponent) > MAX_BITS:
        raise CalculatorError(f"result too large (over {MAX_BITS} bits)")
    return Fraction(base) ** exponent


def _literal(node: ast.Constant, source: str) -> Number:
    if isinstance(node.value, bool) or not isinstance(node.value, int | float):
        raise CalculatorError(f"unsupported literal {ast.get_source_segment(source, node)!r}; use numbers only")
    if isinstance(node.value, int):
        return node.value
    text = ast.get_source_segment(source, node) or repr(node.value)
    try:
        d = Decimal(text)
    except InvalidOperation:
        raise CalculatorError(f"cannot read the number {text!r}") from None
    if not d.is_finite() or abs(d.as_tuple().exponent) > MAX_LITERAL_EXPONENT:
        raise CalculatorError(f"the number {text!r} is too large or too small")
    return Fraction(d)


def _evaluate(node: ast.AST, source: str) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, source)
    if isinstance(node, ast.Constant):
        return _checked(_literal(node, source))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, source), _evaluate(node.right, source)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if isinstance(node.op, ast.BitXor):
            raise CalculatorError("^ is not supported; write ** for a power")
        op = _BINARY.get(type(node.op))
        if op is None:
            raise CalculatorError(f"unsupported operator {type(node.op).__name__}; use + - * / // % ** and ( )")
        if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise CalculatorError("division by zero")
        return _checked(op(left, right))
    segment = ast.get_source_segment(source, node) or type(node).__name__
    raise CalculatorError(f"unsupported expression {segment!r}; use numbers, + - * / // % ** and ( )")


def evaluate(expression: str) -> Number:
    """The exact value of `expression` (int or Fraction), or CalculatorError with the reason."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    source = expression.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"cannot parse the expression ({e.msg})") from None
    except (ValueError, RecursionError, MemoryError) as e:  # a 5000-digit literal, a too-deep nesting
        raise CalculatorError(f"cannot parse the expression ({type(e).__name__})") from None
    try:
        return _evaluate(tree, source)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(value: Number) -> str:
    """An integer as its digits, any other rational as numerator/denominator in lowest terms ("-7/2")."""
    if isinstance(value, Fraction) and value.denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    return str(int(value))
