"""The rows `algo-train doctor` prints: one `Check` per node and check, and the table of them."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("PASS", "WARN", "FAIL")


@dataclass(frozen=True)
class Check:
    where: str  # a node's address, or "run" for checks of the configuration
    name: str
    status: str  # PASS | WARN | FAIL
    found: str
    fix: str = ""


def table(checks: list[Check]) -> str:
    """The checks as an aligned text table; a failure's fix on the line below it."""
    w_where = max([5, *(len(c.where) for c in checks)])
    w_name = max([5, *(len(c.name) for c in checks)])
    lines = [f"{'where':<{w_where}}  {'check':<{w_name}}  status  found"]
    for c in checks:
        lines.append(f"{c.where:<{w_where}}  {c.name:<{w_name}}  {c.status:<6}  {c.found}")
        if c.fix and c.status != "PASS":
            lines.append(f"{'':<{w_where}}  {'':<{w_name}}  {'':<6}  fix: {c.fix}")
    fails = sum(c.status == "FAIL" for c in checks)
    warns = sum(c.status == "WARN" for c in checks)
    lines.append(f"{len(checks)} checks: {len(checks) - fails - warns} passed, {warns} warned, {fails} failed")
    return "\n".join(lines)
