"""Resolve a run configuration: YAML file ← CLI flags ← `--set a.b=c` overrides, then validate.

Errors are `ConfigError`s whose message names the dotted key and says how to fix it; they are raised
before anything starts.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

import algos
from configs.schema import RunConfig


class ConfigError(ValueError):
    """A configuration problem found at parse time (message: `key: problem — fix`)."""


def builtin_config_path(name: str) -> Path:
    """Path of a YAML file shipped in `configs/` (e.g. 'pure' or 'quickstart')."""
    return Path(str(resources.files("configs").joinpath(f"{name}.yaml")))


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config: no such file {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--config: {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {p} must hold a mapping at the top level, found {type(data).__name__}")
    return data


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, f"{prefix}{name}."))
    return keys


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, _known_keys(RunConfig), n=1, cutoff=0.6)
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


def _describe(key: str) -> str:
    """' — expects: <field description>' for a dotted key, or '' when unknown/undocumented."""
    model: type[BaseModel] = RunConfig
    field = None
    for part in key.split("."):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return ""
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return f" — expects: {field.description}" if field is not None and field.description else ""


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key{_suggest(key)}")
        elif not key:  # cross-field rule from RunConfig.problems(); message already names the key
            msg = e["msg"].removeprefix("Value error, ")
            lines.extend(msg.split("; "))
        else:
            got = e.get("input")
            got_s = f" (got {got!r})" if not isinstance(got, dict) else ""
            lines.append(f"{key}: {e['msg']}{got_s}{_describe(key)}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def resolve(algo: str | None = None, config_file: str | None = None, flags: dict[str, Any] | None = None,
            overrides: list[str] | None = None) -> RunConfig:
    """Build the validated RunConfig. `flags` maps dotted keys to values from dedicated CLI flags."""
    if algo is not None and algo not in algos.names():
        raise ConfigError(f"--algo: unknown algorithm {algo!r}; choose one of {', '.join(algos.names())}")
    if config_file is None and algo is None:
        raise ConfigError("--algo: required (or pass --config FILE)")
    data = read_yaml(config_file if config_file else builtin_config_path(algo))
    if algo is not None:
        data["algo"] = algo
    for key, value in (flags or {}).items():
        if value is not None:
            set_dotted(data, key, value)
    for text in overrides or []:
        set_dotted(data, *parse_override(text))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


def dump(cfg: RunConfig) -> str:
    """The fully resolved configuration as YAML (what --dry-run prints and config.yaml holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def dump_annotated(cfg: BaseModel, indent: int = 0) -> str:
    """YAML of a resolved config with each field's description (its unit) as a trailing comment."""
    out = []
    pad = "  " * indent
    for name, field in type(cfg).model_fields.items():
        value = getattr(cfg, name)
        note = f"  # {field.description}" if field.description else ""
        if isinstance(value, BaseModel):
            out.append(f"{pad}{name}:{note}")
            out.append(dump_annotated(value, indent + 1))
        else:
            plain = value if not isinstance(value, tuple) else list(value)
            text = yaml.safe_dump(plain, default_flow_style=True).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            out.append(f"{pad}{name}: {text}{note}")
    return "\n".join(out)
