"""Every `algo-train` command that README.md and docs/running.md show is run through the CLI's parser, the
config validation, "auto" resolution and the placement planner, on the cluster its text declares:

- a code block whose `ray start` lines declare nodes (`--node-ip-address`, `--num-cpus`, `--num-gpus`,
  `--resources`) plans its commands, and those of the later blocks of its section, on those nodes, joined
  as the run would join them;
- a console example (`$ algo-train ...`) followed by `algo-train: <message>` must be refused with that
  message, on the nodes the message lists (the planner names every node it was given);
- any other command plans on the machine a newcomer has (this project's CI machine: 2 CPUs, no GPU, 24 GiB).

So a recipe in the docs that our own checks would refuse fails CI. Files named by a command need not exist
(the preflight that reads them is tested on its own); synopsis lines (`[--flag ...]`, `{a,b}`) are skipped.
"""

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from configs.loading import ConfigError
from launch.cli import build_parser, parse
from launch.planning.resources import Node, ResourceError, plan, resolve_auto

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/running.md"]
NEWCOMER = [Node("127.0.0.1", 2, 0, 24, {})]


@dataclass
class Command:
    where: str  # file:line
    argv: list[str]
    nodes: list[Node]
    refusal: str | None = None  # the message an example shows after "algo-train: "
    joined: bool = False
    notes: list[str] = field(default_factory=list)


def _blocks(text: str):
    """(heading, first line number, lines) of each fenced code block, under the last heading above it."""
    lines, start, body, heading = text.splitlines(), None, [], ""
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            if start is None:
                start, body = i + 1, []
            else:
                yield heading, start, body
                start = None
        elif start is not None:
            body.append(line)
        elif line.startswith("#"):
            heading = line


def _joined(lines: list[str]) -> list[tuple[int, str]]:
    """(offset, logical line) with backslash continuations joined."""
    out, buf, at = [], "", 0
    for i, line in enumerate(lines):
        if not buf:
            at = i
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((at, buf + line))
        buf = ""
    return out


def declared_nodes(lines: list[tuple[int, str]]) -> list[Node]:
    nodes = []
    for _, line in lines:
        words = shlex.split(line.split("#")[0]) if line.strip().startswith("ray start") else []
        if not words:
            continue
        opt = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        assert "--num-cpus" in opt and "--num-gpus" in opt, f"declare the node's size: {line}"
        nodes.append(Node(opt["--node-ip-address"], float(opt["--num-cpus"]), float(opt["--num-gpus"]),
                          float(opt.get("--memory", 1000 * 2**30)) / 2**30, json.loads(opt.get("--resources", "{}"))))
    return nodes


NODE_IN_MESSAGE = re.compile(r"(\d+\.\d+\.\d+\.\d+): (\d+) CPU, (\d+) GPU, ([\d.]+) GiB")


def doc_commands(name: str) -> list[Command]:
    found, declared = [], {}
    for heading, start, body in _blocks((ROOT / name).read_text()):
        lines = _joined(body)
        nodes = declared.setdefault(heading, declared_nodes(lines))  # a section's later blocks: the same cluster
        for k, (at, line) in enumerate(lines):
            text = line.strip().split(" && ")[-1]  # `bash scripts/setup.sh && .venv/bin/algo-train ...`
            example = text.startswith("$ ")
            text = text.removeprefix("$ ").removeprefix(".venv/bin/")
            if not text.startswith("algo-train ") or "[--" in text or "{grpo" in text:
                continue  # prose, comments, program output, synopsis lines
            words = shlex.split(text.split("  #")[0])[1:]
            cmd = Command(f"{name}:{start + at}", words, nodes or NEWCOMER, joined=bool(nodes))
            after = [t.strip() for _, t in lines[k + 1:]]
            if example and after and after[0].startswith("algo-train: "):
                shown = " ".join(after)
                cmd.refusal = shown.removeprefix("algo-train: ")
                listed = [Node(a, float(c), float(g), float(m), {}) for a, c, g, m in NODE_IN_MESSAGE.findall(shown)]
                if listed:
                    cmd.nodes, cmd.joined = listed, True
            found.append(cmd)
    return found


COMMANDS = [c for name in DOCS for c in doc_commands(name)]


def check(cmd: Command) -> str | None:
    """None when the command would start; else the refusal (what `algo-train` prints after its name)."""
    if cmd.argv[:1] == ["plot"]:  # takes run folders only
        return None if len(cmd.argv) > 1 else "plot needs a run folder"
    if cmd.argv[:1] == ["scale"]:  # a live run's folder and a count: its parser, nothing to plan
        from launch.commands.scale import build_parser as scale_parser

        scale_parser().parse_args(cmd.argv[1:])
        return None
    if cmd.argv[:1] == ["eval"]:
        from launch.commands.evaluate import build_parser as eval_parser

        eval_parser().parse_args(cmd.argv[1:])
        return None
    if cmd.argv[:1] == ["doctor"]:  # the run's flags: validated and planned as the run's
        from launch.doctor.command import build_parser as doctor_parser
        from launch.doctor.command import config_for

        try:
            cfg = config_for(doctor_parser().parse_args(cmd.argv[1:]))
            plan(resolve_auto(cfg, cmd.nodes), cmd.nodes, joined=cmd.joined)
        except (ConfigError, ResourceError) as e:
            return " ".join(str(e).split())
        return None
    if "--resume" in cmd.argv:  # needs the run folder it names; the parser must accept the flags
        build_parser().parse_args(cmd.argv)
        return None
    try:
        _, cfg, _ = parse(cmd.argv)
        plan(resolve_auto(cfg, cmd.nodes), cmd.nodes, joined=cmd.joined)
    except (ConfigError, ResourceError) as e:
        return " ".join(str(e).split())
    return None


def test_the_docs_show_the_commands_this_test_reads():
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert where == set(DOCS)
    recipes = [c for c in COMMANDS if c.joined and c.refusal is None]
    assert recipes, "the cluster recipe of docs/running.md was not found"
    assert any(c.refusal for c in COMMANDS), "the refusal example of docs/running.md was not found"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_documented_command_does_what_its_text_says(cmd):
    refused = check(cmd)
    if cmd.refusal is None:
        assert refused is None, f"{cmd.where}: `algo-train {shlex.join(cmd.argv)}` is refused: {refused}"
    else:
        shown = " ".join(cmd.refusal.split())
        assert refused is not None, f"{cmd.where}: the docs show a refusal but the command is accepted"
        assert refused.startswith(shown[:60]), f"{cmd.where}: the docs show\n  {shown}\nbut we print\n  {refused}"


def test_a_refused_recipe_fails_this_test():
    # The recipe as it stood (32 TP-1 actors on one 8-GPU actor node; --data with pure.prm: rule).
    nodes = [Node("10.0.0.1", 96, 8, 1000, {"learner_node": 8}), Node("10.0.0.2", 96, 8, 1000, {"actor_node": 8})]
    argv = shlex.split("--algo pure --actors 32 --model /m --data /d.parquet --ray-address 10.0.0.1:6379 "
                       "--set learner.world_size=8 --set 'rollout.custom_resources={\"actor_node\": 1}'")
    assert check(Command("x", argv, nodes, joined=True)) is not None
