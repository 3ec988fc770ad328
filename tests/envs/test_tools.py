"""Tools as plain functions: their schema, the model's calls in its own format, calls off the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from envs.tool_calls import parse_tool_calls
from envs.tools import Toolbox, ToolCallError, ToolLoadError, load_tool, tool_schema


def add(a: int, b: int = 0) -> str:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)


def test_schema_from_name_types_and_docstring():
    assert tool_schema(add) == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "the first"},
                                                        "b": {"type": "integer", "description": "the second"}},
                       "required": ["a"]},
        "return": {"type": "string"}}}


def untyped(x):
    """No types.

    Args:
        x: something
    """


def star(*xs: int) -> str:
    """Variadic.

    Args:
        xs: numbers
    """


@pytest.mark.parametrize("fn,why", [(untyped, "type hint"), (star, r"\*xs")])
def test_a_tool_that_cannot_be_described_is_refused(fn, why):
    with pytest.raises(ToolLoadError, match=why):
        tool_schema(fn)


def test_loading_names_the_problem(tmp_path):
    with pytest.raises(ToolLoadError, match="neither a built-in"):
        load_tool("no_such_tool")
    with pytest.raises(ToolLoadError, match="no file"):
        load_tool(f"{tmp_path}/missing.py:f")
    f = tmp_path / "t.py"
    f.write_text("def g(x):\n    return x\n")
    with pytest.raises(ToolLoadError, match="tool g"):
        load_tool(f"{f}:g")


def test_tool_calls_in_hermes_and_llama3_formats():
    hermes = 'let me add <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call> and ' \
             '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    calls = parse_tool_calls(hermes)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 2, "b": 3}, None),
                                                               ("add", {"a": 1}, None)]
    llama = '<|python_tag|>{"name": "add", "parameters": {"a": 5}}'
    assert [(c.name, c.arguments) for c in parse_tool_calls(llama)] == [("add", {"a": 5})]
    assert parse_tool_calls("The answer is 5.") == []
    assert parse_tool_calls('{"answer": 5}') == []  # JSON that is no call is an answer
    bad = parse_tool_calls("<tool_call>{not json</tool_call>")
    assert len(bad) == 1 and bad[0].error.startswith("error: the tool call is not valid JSON")


def test_a_sync_tool_runs_off_the_event_loop():
    """The tool blocks its thread until the event loop itself sets a flag: if the call ran on the loop, the
    loop could never set it and the call would time out."""
    released = threading.Event()

    def wait_for_loop(token: str) -> str:
        """Wait until the loop released us.

        Args:
            token: echoed back
        """
        assert released.wait(10), "the event loop was blocked by a sync tool"
        return token

    async def main():
        box = Toolbox([wait_for_loop], timeout_s=10)
        call = asyncio.ensure_future(box.call("wait_for_loop", {"token": "ok"}))
        await asyncio.sleep(0.05)  # the loop runs while the tool blocks its thread
        released.set()
        out = await call
        box.close()
        return out

    assert asyncio.run(main()) == "ok"


def test_timeouts_errors_and_bad_calls():
    def slow(s: float) -> str:
        """Sleep.

        Args:
            s: seconds
        """
        threading.Event().wait(s)
        return "late"

    def boom(x: int) -> str:
        """Raise.

        Args:
            x: anything
        """
        raise RuntimeError("kaput")

    box = Toolbox([slow, boom], timeout_s=0.2)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await box.call("slow", {"s": 2})
        with pytest.raises(ToolCallError, match="kaput"):
            await box.call("boom", {"x": 1})

    asyncio.run(main())
    assert box.bad_call("nope", {}).startswith("error: unknown tool 'nope'")
    assert box.bad_call("boom", {"y": 1}) == "error: boom: missing a required argument: 'x'"
    assert box.bad_call("boom", {"x": 1}) is None
    box.close()


def test_the_built_in_tools_load_by_name_and_answer():
    box = Toolbox([load_tool("calculator"), load_tool("python")], timeout_s=60)
    assert [s["function"]["name"] for s in box.schemas] == ["calculator", "python"]

    async def main():
        return (await box.call("calculator", {"expression": "123456789 * 987654321"}),
                await box.call("python", {"code": "print(6 * 7)"}))

    calc, py = asyncio.run(main())
    assert calc == "121932631112635269" and py.strip() == "42"
    box.close()
