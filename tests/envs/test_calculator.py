"""The exact calculator: goldens with the arithmetic shown, refusals, and sizes that cannot hang."""

import time

import pytest

from envs.builtin_tools import calculator
from envs.calculator import MAX_BITS


@pytest.mark.parametrize("expression, expected", [
    ("1/3 + 1/6", "1/2"),  # 2/6 + 1/6 = 3/6 = 1/2, exactly (floats give 0.49999999999999994 + ...)
    ("0.1 + 0.2", "3/10"),  # decimals are read from their text: 1/10 + 2/10
    ("2**100", "1267650600228229401496703205376"),  # big integers keep every digit
    ("12345678 * 87654321", "1082152022374638"),  # 12345678 * 87654321 = 1_082_152_022_374_638
    ("(10**30 + 1) - 10**30", "1"),  # no float rounding at 10**30
    ("-2**2", "-4"),  # Python precedence: -(2**2)
    ("(-3)**3", "-27"),
    ("2**-2", "1/4"),
    ("7 // 2", "3"), ("-7 // 2", "-4"), ("7 % 3", "1"), ("-7 / 2", "-7/2"),
    ("(7/2) // 1", "3"),  # floor of 3.5
    ("1e3 / 8", "125"),  # 1000 / 8
    ("((2))", "2"), ("+5", "5"),
])
def test_calculator_goldens(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize("expression, reason", [
    ("1/0", "division by zero"), ("5 % 0", "division by zero"), ("0**-1", "division by zero"),
    ("2^3", "write ** for a power"),
    ("2**0.5", "only integer exponents"),
    ("__import__('os').system('id')", "unsupported expression"),
    ("x + 1", "unsupported expression"),
    ("1 +", "cannot parse"),
    ("'a' * 3", "unsupported literal"),
    ("1 if 1 else 2", "unsupported expression"),
    ("1e999999", "too large or too small"),
])
def test_calculator_refuses_with_a_reason(expression, reason):
    out = calculator(expression)
    assert out.startswith("error: ") and reason in out, out


@pytest.mark.parametrize("expression", ["2**10**10", "10**3000 * 10**3000", "(3/2)**100000", "9**9**9**9"])
def test_huge_results_are_refused_before_they_are_computed(expression):
    t = time.perf_counter()
    out = calculator(expression)
    assert out == f"error: result too large (over {MAX_BITS} bits)"
    assert time.perf_counter() - t < 1.0  # 2**10**10 would take minutes and gigabytes if computed


def test_sizes_at_the_bound_are_exact():
    # 2**9999 has 10000 bits (the bound): computed exactly; 2**10000 (10001 bits) is refused.
    assert calculator("2**9999 // 2**9998") == "2"
    assert calculator("2**10000").startswith("error: result too large")


def test_nesting_and_length_cannot_crash_it():
    assert calculator("(" * 500 + "1" + ")" * 500).startswith("error: ")
    assert calculator("1+" * 5000 + "1").startswith("error: expression longer than")
    assert calculator("(-1)**(10**100)") == "1"  # +-1 and 0 to any integer power are cheap
