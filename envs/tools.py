"""Tools as plain Python functions: their JSON schema, how they are loaded, and how a call runs.

A tool is a function with a name, typed parameters and a Google-style docstring (a summary line, then
`Args:` describing every parameter), returning a string (anything else is turned into one with `str`):

    def calculator(expression: str) -> str:
        \"\"\"Evaluate an arithmetic expression exactly.

        Args:
            expression: the expression, e.g. "12345 * 6789"
        \"\"\"

Its schema is the JSON-schema "function" dict HF chat templates take as `tools=` (built by
`transformers.utils.get_json_schema`, the same function `apply_chat_template` uses for a function), so the
model is offered the tools through its own chat template, as TRL's `tools=` and veRL's tool config do.

Loading (`env.tools`): a built-in name (`BUILTIN_TOOLS`), `file.py:fn` or `module:fn`, as reward functions
are named. A tool that cannot load or whose signature does not fit is refused before the run starts with the
reason (`launch.prep.preflight`).

Calling (`Toolbox.call`): an `async def` tool is awaited; a plain function runs on the toolbox's thread pool,
so a slow tool never blocks the actor's event loop (its engine goes on with the other trajectories). Each call
has a wall-time limit (`env.call_timeout_s`); past it the trajectory ends (`env/timeouts`). A sync tool that
hangs keeps its thread until it returns (Python cannot kill a thread): tools that run untrusted code, such as
the built-in Python runner, run it in a process of their own with its own limits.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

# Built-in tools, by the names `env.tools` takes: the functions of `envs.builtin_tools.BUILTIN_TOOLS` (the exact
# calculator, the sandboxed Python runner), imported only when a run names one.
BUILTIN_TOOLS = ("calculator", "python")


class ToolLoadError(ValueError):
    """A tool that cannot be loaded or offered to a model (the message names the fix)."""


def load_object(spec: str, what: str):
    """The callable `spec` names (`file.py:name` or `module:name`, loaded as reward functions are:
    `tasks.worker.load_function`); `ToolLoadError` naming what is wrong."""
    from tasks.worker import load_plugin

    return load_plugin(spec, f"{what} {spec!r}", ToolLoadError, "path/to/file.py:NAME")


def load_tool(spec: str) -> Callable:
    """The tool function `spec` names (a built-in name, `file.py:fn` or `module:fn`), checked."""
    if spec in BUILTIN_TOOLS:
        from envs.builtin_tools import BUILTIN_TOOLS as BUILTINS

        fn = BUILTINS[spec]
    elif ":" in spec:
        fn = load_object(spec, "tool")
    else:
        raise ToolLoadError(f"env.tools: {spec!r} is neither a built-in tool ({', '.join(BUILTIN_TOOLS)}) nor "
                            "FILE.py:FUNCTION / MODULE:FUNCTION")
    tool_schema(fn)  # refuses what a chat template cannot be offered
    return fn


def tool_schema(fn: Callable) -> dict:
    """The JSON-schema "function" dict of `fn` (`{"type": "function", "function": {name, description,
    parameters}}`); `ToolLoadError` naming the fix when its name, signature or docstring does not fit."""
    from transformers.utils import get_json_schema

    if not callable(fn) or not hasattr(fn, "__name__"):
        raise ToolLoadError(f"tool {fn!r}: expected a function")
    name = fn.__name__
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ToolLoadError(f"tool {name}: no inspectable signature ({e})") from e
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolLoadError(f"tool {name}: *{p.name} / **{p.name} cannot be described to a model — name every "
                                "parameter with a type")
    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        raise ToolLoadError(f"tool {name}: {e} — give every parameter a type hint and a Google-style docstring "
                            "with a summary line and an `Args:` entry per parameter") from e


class ToolCallError(RuntimeError):
    """A tool raised, or returned something that is not text."""


class Toolbox:
    """The run's tools by name, their schemas, and calls with a wall-time limit (module docstring)."""

    def __init__(self, tools: Sequence[Callable], timeout_s: float, threads: int = 16):
        self.tools: dict[str, Callable] = {}
        for fn in tools:
            if fn.__name__ in self.tools:
                raise ToolLoadError(f"env.tools: two tools are named {fn.__name__!r} — rename one")
            self.tools[fn.__name__] = fn
        self.schemas = [tool_schema(fn) for fn in self.tools.values()]
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tool")

    def bad_call(self, name: str, arguments) -> str | None:
        """Why the model's call cannot be made (unknown tool, arguments not fitting), else None. The reason
        goes back to the model as the tool's result: it is the policy's mistake, not the environment's."""
        fn = self.tools.get(name)
        if fn is None:
            return f"error: unknown tool {name!r}; the tools are {', '.join(self.tools)}"
        if not isinstance(arguments, dict):
            return f"error: the arguments of {name} must be a JSON object"
        try:
            inspect.signature(fn).bind(**arguments)
        except TypeError as e:
            return f"error: {name}: {e}"
        return None

    async def call(self, name: str, arguments: dict) -> str:
        """The result of one call as text. Raises `asyncio.TimeoutError` past the limit and `ToolCallError`
        when the tool raised."""
        fn = self.tools[name]
        if inspect.iscoroutinefunction(fn):
            work = fn(**arguments)
        else:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(self._pool, functools.partial(fn, **arguments))
        try:
            out = await asyncio.wait_for(work, self.timeout_s)
        except asyncio.TimeoutError:
            raise
        except Exception as e:
            raise ToolCallError(f"tool {name} raised {type(e).__name__}: {e}") from e
        return out if isinstance(out, str) else json.dumps(out) if isinstance(out, dict | list) else str(out)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
