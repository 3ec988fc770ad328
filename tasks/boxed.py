"""Final-answer extraction shared by every reward here: the content of the last ``\\boxed``.

Why one place: the synthetic task, the math-verify reward and the Hendrycks-style scorer must agree on
which part of a response is "the answer". Forms accepted, as in the MATH dataset's own solutions:
``\\boxed{...}`` with nested braces (``\\fbox{...}`` too), and ``\\boxed x`` (space form, content up to
the next ``$`` or the end). The last occurrence wins; an unclosed brace means no answer.
"""

from __future__ import annotations

_OPENERS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}``/``\\boxed x`` in `text`, or None."""
    start, opener = max((text.rfind(o), o) for o in _OPENERS)
    if start < 0:
        return None
    rest = text[start + len(opener) :]
    if rest.startswith(" "):
        return rest[1:].split("$")[0]
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None
