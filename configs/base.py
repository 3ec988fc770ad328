"""The base of every config section (`Section`: unknown keys refused, no booleans for numbers), resource
counts that may be "auto", and the section built from an algorithm's options dataclass (`algos.options`)."""

from __future__ import annotations

import dataclasses
import functools
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
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
"""A resource count that `launch.cluster.ClusterInfo.resolve` turns into a number at launch."""


@functools.cache
def option_section(options: type) -> type[Section]:
    """The config section of an algorithm's options dataclass (`algos.options`): each field's type,
    default, description and bounds, its `before`/`after` hooks as pydantic validators. One class per
    options class, published as `configs.base.<name>` so that pickle finds it (the learner ranks a test
    spawns receive the config pickled)."""
    hints = get_type_hints(options)
    fields = {}
    for f in dataclasses.fields(options):
        meta = dict(f.metadata)
        hooks = [BeforeValidator(meta.pop("before"))] if "before" in meta else []
        hooks += [AfterValidator(meta.pop("after"))] if "after" in meta else []
        annotation = Annotated[(hints[f.name], *hooks)] if hooks else hints[f.name]
        fields[f.name] = (annotation, Field(f.default, **meta))
    section = create_model(options.__name__, __base__=Section, __doc__=options.__doc__, __module__=__name__, **fields)
    globals()[section.__name__] = section
    return section


def __getattr__(name: str):
    """A generated section asked for before `configs.schema` built it (an unpickler in a fresh process)."""
    if name.startswith("__"):  # `from configs.base import X` asks for __path__: never build the schema for it
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import configs.schema  # noqa: F401  (builds every algorithm's section)

    if name in globals():
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
