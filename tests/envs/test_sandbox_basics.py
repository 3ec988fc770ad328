"""The sandbox's contract with its callers: limits, the description of what is active, the python tool."""

import inspect
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envs.builtin_tools import BUILTIN_TOOLS, calculator, python_tool
from envs.sandbox import Sandbox, SandboxLimits, SandboxResult, describe, describe_protections


@pytest.mark.parametrize("field, value", [("cpu_s", 0), ("cpu_s", 1.5), ("memory_mb", 32), ("output_bytes", -1),
                                          ("max_processes", True), ("wall_s", 0), ("scratch_mb", 0)])
def test_limits_refuse_bad_values_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=f"SandboxLimits.{field}"):
        SandboxLimits(**{field: value})


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="choose 'auto', 'namespaces' or 'plain'"):
        Sandbox(mode="docker")


def test_description_never_claims_a_layer_that_is_absent():
    lim = SandboxLimits()
    bare = describe("plain", 0, lim)
    assert "files and network NOT isolated" in bare and "Landlock ABI" not in bare
    assert "network NOT isolated" in describe("plain", 3, lim)  # Landlock before ABI 4 has no network rules
    if os.geteuid() == 0:
        assert "process count NOT limited" in bare
    full = describe("namespaces", 0, lim)
    assert "Landlock ABI" not in full and "Landlock TCP" not in full and "pid namespace" in full and "network namespace" in full


def test_auto_mode_probes_and_describes_what_is_active():
    line = describe_protections(SandboxLimits(cpu_s=2))
    assert line.startswith("sandbox (") and "CPU 2 s/process (RLIMIT_CPU)" in line
    if os.geteuid() == 0:  # our machines and CI: namespaces work as root
        assert line.startswith("sandbox (namespaces mode)"), line


def test_python_tool_is_a_plain_function_with_a_typed_signature_and_a_docstring():
    python = python_tool(SandboxLimits(cpu_s=3, wall_s=7, memory_mb=512, output_bytes=4000))
    assert python.__name__ == "python"
    sig = inspect.signature(python)
    assert list(sig.parameters) == ["code"] and sig.parameters["code"].annotation in (str, "str")
    assert sig.return_annotation in (str, "str")
    doc = inspect.getdoc(python)
    assert doc.startswith("Run a Python 3 program") and "Args:\n    code:" in doc
    assert "3 s of CPU time, 7 s of wall time" in doc and "512 MB of memory, 4000 bytes of output" in doc
    assert python("print(sum(range(10)))") == "45\n"
    assert python("x = 1") == "(no output)"
    assert python("import sys; sys.exit(3)") == "exit status 3"


def test_builtin_tools_are_named_as_the_model_calls_them():
    assert set(BUILTIN_TOOLS) == {"calculator", "python"}
    assert BUILTIN_TOOLS["calculator"] is calculator and BUILTIN_TOOLS["python"].__name__ == "python"
    assert inspect.getdoc(calculator).startswith("Evaluate an arithmetic expression exactly")
    assert "Args:\n    expression:" in inspect.getdoc(calculator)


def test_calls_from_several_threads_at_once_stay_apart():
    box = Sandbox(SandboxLimits(wall_s=20.0))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: box.run(f"open('mine', 'w').write('{i}')\nprint(open('mine').read())"),
                                range(8)))
    assert [r.output for r in results] == [f"{i}\n" for i in range(8)]


def test_observation_joins_output_and_error():
    r = SandboxResult("partial", None, "wall", "error: time limit 1 s exceeded (wall time)", 1.0)
    assert r.observation() == "partial\nerror: time limit 1 s exceeded (wall time)"
    assert SandboxResult("", 0, None, None, 0.1).observation() == "(no output)"


def test_an_oversized_program_is_refused_without_starting():
    r = Sandbox().run("#" * (2 << 20))
    assert r.error.startswith("error: the program is longer than") and r.wall_s == 0.0


def test_the_tools_import_neither_torch_nor_vllm():
    code = "import sys, envs.builtin_tools; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.stdout == "[]\n", out.stderr
