"""Resolve a run configuration: the algorithm's YAML ← a user's YAML ← CLI flags ← `--set a.b=c`
overrides, then validate.

Layering: `--algo NAME` starts from configs/NAME.yaml; `--config FILE` is laid over the YAML of the
algorithm it names (its `algo:` key, or `--algo`, which wins), so a file holding only the keys it
changes keeps the algorithm's tuned values for the rest. A user's model (model.path set) gets real-model
values between the algorithm's YAML and the user's keys (`configs.presets`). A run folder's config.yaml
(`resolve_saved`) is complete and is read as it is.

Keys as veRL or TRL spell them are read as ours where they mean the same (`configs.aliases`: each
said once on stderr), in a `--config` file and in `--set`; the others stay unknown, and the error names
our key and what differs. A key of another algorithm's section (`pacs.beta` on a grpo run) is refused:
the run would never read it. Only the keys the user gives are checked, not the algorithm's YAML.

Errors are `ConfigError`s whose message names the dotted key and says how to fix it; they are raised
before anything starts.
"""

from __future__ import annotations

import copy
import difflib
import sys
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from configs import aliases
from configs.algo_sections import SECTIONS
from configs.presets import fit_model
from configs.schema import LearnerConfig, RunConfig


class ConfigError(ValueError):
    """A configuration problem found at parse time (message: `key: problem — fix`)."""


def builtin_config_path(name: str) -> Path:
    """Path of a YAML file shipped in `configs/` (e.g. 'pure' or 'quickstart')."""
    return Path(str(resources.files("configs").joinpath(f"{name}.yaml")))


def read_yaml(path: str | Path, what: str = "--config") -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what}: no such file {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{what}: {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {p} must hold a mapping at the top level, found {type(data).__name__}")
    return data


def _section(field) -> type[BaseModel] | None:
    ann = field.annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        if _section(field) is not None:
            keys.extend(_known_keys(_section(field), f"{prefix}{name}."))
    return keys


def _suggest(key: str, algo: str | None = None) -> str:
    """The hint of an unknown key: veRL's or TRL's name first (it names ours and what differs), else the
    closest of our keys outside the other algorithms' sections."""
    known = aliases.hint(key)
    if known is not None:
        return known
    ours = [k for k in _known_keys(RunConfig) if k.split(".")[0] not in set(SECTIONS) - {algo}]
    close = difflib.get_close_matches(key, ours, n=1, cutoff=0.6)
    return f" — did you mean {close[0]!r}?" if close else " — run with --dry-run to list the valid keys"


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section, so {key!r} cannot be set")
        node = nxt
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=c' -> ('a.b', yaml-parsed c)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. --set buffer.max_staleness=2")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`: mappings merge key by key, any other value of `top` replaces (lists too)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _our_key(key: str, say: bool = False) -> str:
    """`key`, or ours when it is veRL's or TRL's name of the same setting (said on stderr with `say`)."""
    alias = aliases.accepted(key)
    if alias is None:
        return key
    if say:
        print(aliases.notice(alias), file=sys.stderr)
    return alias.ours


def _read_aliases(user: dict[str, Any], where: str) -> dict[str, Any]:
    """A user's mapping with the keys veRL or TRL spell differently, where they mean the same, moved to
    ours (each said on stderr), and the sections the moves empty dropped. Refused when the mapping also
    gives our key another value."""
    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in list(node.items()):
            path = prefix + str(key)
            if aliases.accepted(path):
                moved.append((aliases.accepted(path), node.pop(key)))
            elif isinstance(value, dict) and aliases.leads_to_alias(path):
                walk(value, path + ".")
                if not value:
                    del node[key]

    out, moved = copy.deepcopy(user), []
    walk(out, "")
    for alias, value in moved:
        ours = out
        for part in alias.ours.split("."):
            ours = ours.get(part) if isinstance(ours, dict) else None
        if ours is not None and ours != value:
            raise ConfigError(f"{alias.name}: {alias.origin}'s name of {alias.ours}, which {where} also sets to "
                              "another value — keep one of the two")
        set_dotted(out, alias.ours, value)
        print(aliases.notice(alias), file=sys.stderr)
    return out


def _refuse_other_algorithms(keys, algo: str | None) -> None:
    """Refuse user keys in the section of an algorithm other than the run's (module docstring)."""
    keys, others = set(keys), set(SECTIONS) - {algo}
    deepest = sorted(k for k in keys if not any(o.startswith(k + ".") for o in keys))  # `pacs.beta`, not `pacs`
    lines = [f"{k}: belongs to --algo {owner}, and this run is --algo {algo} — drop it, or run --algo {owner}"
             for k in deepest if (owner := k.split(".")[0]) in others]
    if lines:
        raise ConfigError(lines[0] if len(lines) == 1 else "invalid configuration:\n  " + "\n  ".join(lines))


def apply_flags(data: dict[str, Any], flags: dict[str, Any] | None, overrides: list[str] | None) -> dict[str, Any]:
    """`data` with the dedicated flags (None = not given) and then the `--set` overrides applied (in place);
    veRL/TRL names read as ours, keys of another algorithm's section refused."""
    given = []
    for key, value in (flags or {}).items():
        if value is not None:
            set_dotted(data, key, value)
            given.append(key)
    for text in overrides or []:
        key, value = parse_override(text)
        given.append(_our_key(key, say=True))
        set_dotted(data, given[-1], value)
    _refuse_other_algorithms(given, data.get("algo"))
    return data


def value_of(cfg: RunConfig, key: str):
    """The value of a dotted key ("pure.prm_path") in a resolved config."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def field_of(key: str):
    """The pydantic field of a dotted key, or None when there is no such key."""
    model: type[BaseModel] | None = RunConfig
    field = None
    for part in key.split("."):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        model = _section(field)
    return field


def _describe(key: str) -> str:
    """' — expects: <field description>' for a dotted key, or '' when unknown/undocumented."""
    field = field_of(key)
    return f" — expects: {field.description}" if field is not None and field.description else ""


def _leaves(key: str, value: Any) -> list[str]:
    """The dotted keys under an unknown key's value (a whole unknown section names each of its keys)."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{key}.{k}", v)]
    return [key]


def _format(err: ValidationError, algo: str | None = None) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.extend(f"{leaf}: unknown key{_suggest(leaf, algo)}" for leaf in _leaves(key, e.get("input")))
        elif not key:  # cross-field rule from RunConfig.problems(); message already names the key
            lines.extend(msg.split("; "))
        else:
            got = e.get("input")
            got_s = f" (got {got!r})" if not isinstance(got, dict) and e["type"] != "value_error" else ""
            lines.append(f"{key}: {msg}{got_s}{_describe(key)}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def validate(data: dict[str, Any]) -> RunConfig:
    """RunConfig of a plain mapping; a validation error becomes one ConfigError listing every problem."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(e, data.get("algo") if isinstance(data, dict) else None)) from None


def base_data(algo: str | None, config_file: str | None, user: dict[str, Any] | None = None) -> dict[str, Any]:
    """The mapping a run starts from: configs/<algo>.yaml, with `config_file` laid over it (module docstring);
    `user`: that file's mapping as `read_user` gave it (read here when None)."""
    import algos

    names = algos.names()
    if algo is not None and algo not in names:
        raise ConfigError(f"--algo: unknown algorithm {algo!r}; choose one of {', '.join(names)}")
    if config_file is None:
        if algo is None:
            raise ConfigError(f"--algo: required (choose one of {', '.join(names)}) or pass --config FILE")
        return read_yaml(builtin_config_path(algo))
    user = read_user(config_file) if user is None else user
    name = algo if algo is not None else user.get("algo")
    if name is None:
        raise ConfigError(f"algo: {config_file} has no `algo:` key, so there is no algorithm config to lay it over "
                          f"— add e.g. `algo: grpo` to it or pass --algo NAME ({', '.join(names)})")
    if name not in names:
        raise ConfigError(f"algo: unknown algorithm {name!r} in {config_file}; choose one of {', '.join(names)}")
    return deep_merge(read_yaml(builtin_config_path(name)), user) | {"algo": name}


def resolve(algo: str | None = None, config_file: str | None = None, flags: dict[str, Any] | None = None,
            overrides: list[str] | None = None) -> RunConfig:
    """Build the validated RunConfig. `flags` maps dotted keys to values from dedicated CLI flags.
    Defaults adjusted to fit the run (`fit_warmup`) are printed once, to stderr."""
    user = read_user(config_file) if config_file else {}
    data = base_data(algo, config_file, user)
    if algo is not None:
        data["algo"] = algo
    given = user_keys(user, flags, overrides)
    apply_flags(data, flags, overrides)
    _refuse_other_algorithms(given, data.get("algo"))
    fit_model(data, given)
    for notice in fit_warmup(data, given):
        print(f"algo-train: {notice}", file=sys.stderr)
    return validate(data)


def read_user(config_file: str) -> dict[str, Any]:
    """A `--config` file's mapping, veRL/TRL names read as ours."""
    return _read_aliases(read_yaml(config_file), config_file)


def user_keys(user: dict[str, Any], flags: dict[str, Any] | None, overrides: list[str] | None) -> set[str]:
    """The dotted keys the user gave (in the --config mapping `user`, a dedicated flag or --set), not the
    algorithm's YAML."""
    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            keys.add(prefix + str(key))
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    keys: set[str] = set()
    walk(user, "")
    keys |= {k for k, v in (flags or {}).items() if v is not None}
    keys |= {_our_key(parse_override(text)[0]) for text in overrides or []}
    return keys


def fit_warmup(data: dict[str, Any], given: set[str]) -> list[str]:
    """Shorten a default LR warm-up longer than the run to the run's optimiser steps (in place) and say so.

    The algorithms' YAMLs warm up over 10 optimiser steps, so a short run (`--steps 3`) would never reach
    the peak lr; the warm-up then ends at the run's last optimiser step, as if it had been set so. A
    warm-up the user set (`learner.warmup_steps` in --config or --set) is theirs, and one longer than the
    run is refused by the schema's rule instead. Values of the wrong type are left to the schema."""
    learner = data.get("learner")
    if not isinstance(learner, dict) or "learner.warmup_steps" in given:
        return []
    defaults = LearnerConfig.model_fields
    warmup, steps, minis, epochs = (learner.get(k, defaults[k].default)
                                    for k in ("warmup_steps", "steps", "mini_batches", "epochs"))
    if not all(type(v) is int and v >= 1 for v in (steps, minis, epochs)) or type(warmup) is not int:
        return []
    total = steps * minis * epochs
    if warmup <= total:
        return []
    learner["warmup_steps"] = total
    return [f"learner.warmup_steps: the default LR warm-up of {warmup} optimiser steps is longer than this run "
            f"(learner.steps={steps} × mini_batches {minis} × epochs {epochs} = {total}); shortened to {total}"]


def resolve_saved(path: str | Path) -> RunConfig:
    """A run folder's config.yaml, validated as it is (no layering: it holds every key)."""
    return validate(read_yaml(path, what="--resume"))


def flat(cfg: RunConfig) -> dict[str, Any]:
    """{dotted key: JSON value} of every leaf key of `cfg` (for comparing two configurations)."""
    def walk(node: dict[str, Any], model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = _section(field)
            if sub is not None:
                walk(node[name], sub, f"{prefix}{name}.")
            else:
                out[prefix + name] = node[name]

    out: dict[str, Any] = {}
    walk(cfg.model_dump(mode="json"), RunConfig, "")
    return out


def dump(cfg: RunConfig) -> str:
    """The fully resolved configuration as plain YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def _choices(annotation) -> list[Any]:
    """The fixed values of a Literal annotation, also as `Literal | None` or `list[Literal]`; else []."""
    origin, args = get_origin(annotation), [a for a in get_args(annotation) if a is not type(None)]
    if origin is Literal:
        return args
    if origin in (list, Union, UnionType) and len(args) == 1:
        return _choices(args[0])
    return []


def _note(name: str, field, model: type[BaseModel]) -> str:
    text = field.description or ""
    choices = _choices(field.annotation)
    if model is RunConfig and name == "algo":
        import algos

        choices = algos.names()
    if choices:
        listed = " | ".join(str(c) for c in choices)
        text = f"{text} [choices: {listed}]" if text else f"[choices: {listed}]"
    return f"  # {text}" if text else ""


def dump_annotated(cfg: BaseModel, indent: int = 0) -> str:
    """YAML of a resolved config, each key followed by its meaning and unit as a comment, with the
    choices of fixed-choice keys listed. Of the algorithm sections (grpo:, prime:, ...) only the run's
    own is written: the others are never read by this run. This is what --dry-run prints and what a
    run folder's config.yaml holds (read back with `resolve_saved`; left-out sections take defaults)."""
    import algos

    out = []
    pad = "  " * indent
    model = type(cfg)
    plain = cfg.model_dump(mode="json")
    skip = set(algos.names()) - {getattr(cfg, "algo", None)} if model is RunConfig else set()
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            out.append(f"{pad}{name}:{_note(name, field, model)}")
            out.append(dump_annotated(value, indent + 1))
        else:
            text = yaml.safe_dump(plain[name], default_flow_style=True, width=10**6).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            out.append(f"{pad}{name}: {text}{_note(name, field, model)}")
    return "\n".join(out)
