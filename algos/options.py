"""How an algorithm declares its options without pydantic or torch (`configs.schema` turns them into a
validated section of the run config).

An options class is a stdlib dataclass whose fields are made with `option(default, description,
**checks)`: `checks` are pydantic's numeric bounds (`gt`, `ge`, `lt`, `le`) plus two hooks, `before`
(a function of the raw value, run before type checking: conversions of legacy spellings) and `after`
(a function of the typed value: returns it, or raises ValueError with the fix). Annotations are the
field's type as pydantic reads it (`Literal[...]` for fixed choices: --dry-run lists them).
"""

from __future__ import annotations

import re
from dataclasses import field
from pathlib import Path
from typing import Any


def option(default: Any, description: str, **checks: Any) -> Any:
    """A dataclass field with its description (unit included) and its checks (module docstring)."""
    return field(default=default, metadata={"description": description, **checks})


def function_name(value: str | None, key: str, names: tuple[str, ...]) -> str | None:
    """`value` if it is one of `names`, ``module:function`` or ``path/to/file.py:function`` (a relative file
    made absolute against the current directory, as launch.state.storage does for path keys); else one error."""
    if value is None or value in names:
        return value
    where, sep, attr = value.rpartition(":")
    if not (sep and where and re.fullmatch(r"[A-Za-z_][\w.]*", attr)):
        raise ValueError(f"{value!r} is not {', '.join(names)}, module:function or path/to/file.py:function — "
                         f"set {key} to one of these")
    return f"{Path(where).expanduser().absolute()}:{attr}" if where.endswith(".py") else value

