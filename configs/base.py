"""The base of every config section (`Section`: unknown keys refused, no booleans for numbers), resource
counts that may be "auto", and the section built from an algorithm's options dataclass (`algos.options`)."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationInfo,
    field_validator,
)


def _is_number_key(annotation) -> bool:
    """True for int/float annotations (alone, `| None`, a union with a Literal, or a Literal of numbers)."""
    if annotation in (int, float):
        return True
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return bool(args) and all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
    return get_origin(annotation) in (Union, UnionType) and any(_is_number_key(a) for a in args)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info: ValidationInfo):
        """A YAML true/false is not a count: pydantic's lax mode would read it as 1/0 (`learner.steps=true`
        ran one step). Numeric keys refuse booleans; boolean and string keys are untouched."""
        if isinstance(value, bool) and _is_number_key(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expects a number, got the boolean {str(value).lower()}")
        return value


def _auto_or_count(value):
    """'auto', or a number ≥ 0 (one error message instead of one per union member)."""
    if value == "auto":
        return value
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < 0:
        raise ValueError(f"expects 'auto' or a number ≥ 0, got {value!r}")
    return number


AutoCount = Annotated[float | Literal["auto"], BeforeValidator(_auto_or_count)]
"""A resource count that `launch.planning.cluster.ClusterInfo.resolve` turns into a number at launch."""
