"""The model's tool calls, read from the text of its turn in the formats chat templates teach.

- Qwen / Hermes (and every template that follows them): one or more
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the turn;
- Llama 3.x JSON tool calling: the whole turn is one JSON object `{"name": ..., "parameters": {...}}`
  (optionally after `<|python_tag|>`).

`arguments` may also arrive as a JSON string holding the object (some models write it so). A block that
does not parse is a call the model got wrong: it comes back as a `ToolCall` with `error` set, and the
error goes back to the model as that call's result (it is the policy's mistake, not the environment's).
Text is only read here, never re-tokenized: the trajectory keeps the policy's tokens exactly as sampled.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None  # why the call could not be read (sent back to the model as its result)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls of one turn, in order; [] when the turn calls no tool (the episode's final answer)."""
    blocks = _HERMES.findall(text)
    if blocks:
        return [_call(b, "arguments") for b in blocks]
    stripped = text.strip()
    if stripped.startswith(_PYTHON_TAG):
        stripped = stripped[len(_PYTHON_TAG):].strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            obj = json.loads(stripped)
        except ValueError:
            return []
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and ("parameters" in obj or "arguments" in obj):
            return [_from_obj(obj, "parameters" if "parameters" in obj else "arguments")]
    return []


def _call(block: str, key: str) -> ToolCall:
    try:
        obj = json.loads(block.strip())
    except ValueError as e:
        return ToolCall("", error=f"error: the tool call is not valid JSON ({e})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error='error: a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    return _from_obj(obj, key if key in obj else "parameters")


def _from_obj(obj: dict, key: str) -> ToolCall:
    args = obj.get(key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return ToolCall(obj["name"], error=f"error: the arguments of {obj['name']} are not a JSON object")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error=f"error: the arguments of {obj['name']} must be a JSON object")
    return ToolCall(obj["name"], args)
