"""The buffer imports only zmq, msgpack, numpy and the standard library (checked on the source and live)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"zmq", "msgpack", "numpy", "buffer", "__future__"}


def test_buffer_sources_import_only_allowed_modules():
    bad = []
    for path in sorted((ROOT / "buffer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top in ("pickle", "cloudpickle", "dill") or (
                        top not in ALLOWED and top not in sys.stdlib_module_names):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)


def test_importing_the_buffer_loads_no_torch():
    code = ("import sys, buffer.service, buffer.client, buffer.process, buffer.snapshot; "
            "bad = [m for m in ('torch', 'pydantic', 'yaml', 'vllm') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
