"""Hendrycks-MATH-style boxed scorer: PURE-main's verifier (REFERENCE_NOTES §6.1).

Why: PURE's reference reward is plain string matching after the MATH dataset's normalisation, not
math-verify; `hendrycks_score` reproduces it (golden cases: /work/shared/vectors/pure_math_score.json)
so PURE runs can be compared with the reference. Written here from the published description of the
normalisation (Hendrycks et al., "Measuring Mathematical Problem Solving With the MATH Dataset", 2021,
and its `math_equivalence.py`); no code is copied. Known consequences: ``45,000`` is not ``45000``, and
``\\text{(A)}`` is not ``(A)``.
"""

from __future__ import annotations

import re

from tasks.boxed import last_boxed

# Plain deletions and substitutions, applied in this order (before units and percentages are handled).
_REPLACEMENTS = (
    ("\n", ""),
    ("\\!", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
)


def strip_string(s: str) -> str:
    """MATH normalisation: drop layout commands, degree signs, dollars, right-hand units (after
    ``\\text{ ``), percent signs and spaces; add leading zeros to decimals; drop a short ``x=`` prefix;
    brace ``\\sqrt3``/``\\frac12``; map ``0.5`` and integer ``a/b`` to ``\\frac``s.

    Raises ValueError where the original raises (more than one ``\\text{ `` units marker).
    """
    for old, new in _REPLACEMENTS:
        s = s.replace(old, new)
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError(f"ambiguous units in {s!r}")
        s = parts[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    lhs_rhs = s.split("=")
    if len(lhs_rhs) == 2 and len(lhs_rhs[0]) <= 2:
        s = lhs_rhs[1]
    s = re.sub(r"\\sqrt([^{])", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = re.sub(r"\\frac([^{])([^{])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac([^{])(?=\{)", r"\\frac{\1}", s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    m = re.fullmatch(r"(-?\d+)/(-?\d+)", s)
    if m and str(int(m[1])) == m[1] and str(int(m[2])) == m[2]:
        s = f"\\frac{{{m[1]}}}{{{m[2]}}}"
    return s


def is_equiv(a: str | None, b: str | None) -> bool:
    """Equal after `strip_string` (raw equality where normalisation fails); None equals only None."""
    if a is None or b is None:
        return a is b
    try:
        return strip_string(a) == strip_string(b)
    except ValueError:
        return a == b


def hendrycks_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer of `solution_str` equals `ground_truth` under `is_equiv`, else 0.0."""
    pred = last_boxed(solution_str)
    return 1.0 if pred is not None and is_equiv(pred, ground_truth) else 0.0
