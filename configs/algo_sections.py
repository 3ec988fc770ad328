"""Each registered algorithm's config section, built from its options dataclass (`algos.options`), one
class per algorithm, published here under the options' name (`configs.algo_sections.GRPOOptions`) so that
pickle finds it: a process that unpickles a config (the learner ranks a test spawns) imports this module,
which builds every section again from the torch-free registry."""

from __future__ import annotations

import dataclasses
from typing import Annotated, get_type_hints

from pydantic import AfterValidator, BeforeValidator, Field, create_model

import algos
from configs.base import Section


def option_section(options: type) -> type[Section]:
    """The config section of an algorithm's options dataclass: each field's type, default, description and
    bounds, its `before`/`after` hooks as pydantic validators."""
    hints = get_type_hints(options)
    fields = {}
    for f in dataclasses.fields(options):
        meta = dict(f.metadata)
        hooks = [BeforeValidator(meta.pop("before"))] if "before" in meta else []
        hooks += [AfterValidator(meta.pop("after"))] if "after" in meta else []
        annotation = Annotated[(hints[f.name], *hooks)] if hooks else hints[f.name]
        fields[f.name] = (annotation, Field(f.default, **meta))
    return create_model(options.__name__, __base__=Section, __doc__=options.__doc__, __module__=__name__, **fields)


SECTIONS: dict[str, type[Section]] = {}  # algorithm name -> its section (algorithms with options of their own)
for _name in algos.names():
    if (_options := algos.get(_name).options) is not None:
        SECTIONS[_name] = globals()[_options.__name__] = option_section(_options)
