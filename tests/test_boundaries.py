"""Import boundaries of DESIGN.md, checked on the source (AST), so they hold without running anything.

- `algos/` imports only torch, the standard library and itself.
- `vllm` is imported only in `actors/` and `weightsync/` (tests and benchmarks may use it).
- no pickle on the data paths (actors, buffer, learner, weightsync): the wire format is msgpack only.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["algos", "actors", "buffer", "learner", "weightsync", "configs", "launch", "tasks"]


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []


def test_algos_imports_only_torch_and_stdlib():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}"
           for p in files("algos") for line, mod in imports_of(p)
           if mod not in ("torch", "algos", "__future__") and mod not in sys.stdlib_module_names]
    assert not bad, "algos/ may import torch only:\n" + "\n".join(bad)


def test_vllm_only_in_actors_and_weightsync():
    bad = [f"{p.relative_to(ROOT)}:{line}" for pkg in PACKAGES if pkg not in ("actors", "weightsync")
           for p in files(pkg) for line, mod in imports_of(p) if mod == "vllm"]
    assert not bad, "vllm imported outside actors/ and weightsync/:\n" + "\n".join(bad)


@pytest.mark.parametrize("pkg", ["actors", "buffer", "learner", "weightsync"])
def test_no_pickle_on_data_paths(pkg):
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in files(pkg)
           for line, mod in imports_of(p) if mod in ("pickle", "cloudpickle", "dill")]
    assert not bad, "\n".join(bad)


def test_checker_sees_violations(tmp_path):
    # The checker itself must be able to fail.
    f = tmp_path / "m.py"
    f.write_text("import numpy as np\nfrom vllm import LLM\nfrom . import x\n")
    assert imports_of(f) == [(1, "numpy"), (2, "vllm")]
