"""The two examples of docs/running.md "Tools and environments", taken from the page itself and run: the tool is
loaded, described and called as the model would call it; the environment plays a scripted two-turn episode."""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path

from envs.environment import load_environment_class
from envs.episode import ClassSteps, ToolSteps, run_episode
from envs.render import ObservationRenderer
from envs.tools import Toolbox, load_tool
from tests.envs.helpers import EOS, TOKENIZER, ScriptedPolicy, decode, ids, limits, render_with

ROOT = Path(__file__).resolve().parents[2]


def docs_examples() -> dict[str, str]:
    """{file name: code} of the section's python blocks (each starts with a `# name.py` line)."""
    text = (ROOT / "docs/running.md").read_text()
    section = text.split("## Tools and environments\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return {b.splitlines()[0].lstrip("# ").strip(): b for b in blocks}


def write_examples(folder: Path) -> dict[str, Path]:
    out = {}
    for name, code in docs_examples().items():
        (folder / name).write_text(code)
        out[name] = folder / name
    return out


def test_the_docs_tool_example(tmp_path):
    files = write_examples(tmp_path)
    fn = load_tool(f"{files['my_tools.py']}:multiply")
    box = Toolbox([fn], timeout_s=5)
    assert box.schemas[0]["function"]["parameters"]["required"] == ["a", "b"]
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 123456789, "b": 987654321}}</tool_call>'
    render = functools.partial(render_with, ObservationRenderer(TOKENIZER, tools=box.schemas))
    t = asyncio.run(run_episode(ids("<s>Q"), ScriptedPolicy([call, "done"]), ToolSteps(box), render, decode, limits()))
    # 123456789 × 987654321 = 121932631112635269, exactly
    assert "<tool_response>121932631112635269</tool_response>" in TOKENIZER.decode(t.tokens)
    assert (t.ended, t.turns, t.tool_calls) == ("stop", 2, 1)
    box.close()


def test_the_docs_environment_example(tmp_path):
    files = write_examples(tmp_path)
    cls = load_environment_class(f"{files['guess.py']}:Guess")
    env = cls()
    assert env.reset({"ground_truth": " 42 ", "question": "?", "data_source": "", "extra": {}, "prompt_index": 0}) \
        is None
    render = functools.partial(render_with, ObservationRenderer(TOKENIZER))
    t = asyncio.run(run_episode(ids("<s>Q"), ScriptedPolicy(["41", "42"]), ClassSteps(env, 1.0), render, decode,
                                limits()))
    assert (t.ended, t.turns, t.reward) == ("stop", 2, 1.0)
    assert t.tokens == ids("41") + [EOS] + ids("<|user|>try again<|assistant|>") + ids("42") + [EOS]
