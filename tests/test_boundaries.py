"""Import boundaries of DESIGN.md, checked on the source (AST), so they hold without running anything.

- `algos/` imports only torch, the standard library and itself.
- `vllm` is imported only in `actors/` and `weightsync/` (tests and benchmarks may use it).
- no pickle on the data paths (actors, buffer, learner, weightsync): the wire format is msgpack only.
- inside `launch/`, `weightsync/`, `algos/` and `bench/`, imports between sub-packages go one way (`LAYERS`), and
  no folder of the package or of `bench/` holds more than 15 modules directly.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["algos", "actors", "buffer", "learner", "weightsync", "configs", "launch", "tasks", "envs"]


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


# The rooms of a package, top to bottom: a module may import its own room or one below it. "*" is the
# modules directly in the package's folder; a tuple is one layer of peer rooms (none may import another);
# ALGORITHM stands for every algorithm's folder, which are peers too. Each sub-package's `__init__` docstring
# says the same in words.
ALGORITHM = "<an algorithm's folder>"
LAYERS = {
    "launch": ["*", "doctor", "commands", "loop", "state", "processes", "prep", "planning"],
    "weightsync": ["nccl", "gloo", "*"],
    "algos": [ALGORITHM, "*"],
    "bench": ["*", ("evidence", "chaos", "peers", "e2e", "gpu"), "perf", "common"],
}
MAX_MODULES = 15


def rooms_named(layers: list) -> set[str]:
    return {room for layer in layers for room in (layer if isinstance(layer, tuple) else (layer,))}


def room_of(pkg_dir: Path, parts: list[str]) -> str:
    """The room of `pkg_dir`'s module at relative path `parts` (or of the import target `pkg.<parts>`)."""
    return parts[0] if parts and (pkg_dir / parts[0]).is_dir() else "*"


def upward_imports(pkg: str, root: Path = ROOT, layers: list[str] | None = None) -> list[str]:
    """Every import in `root/pkg` that goes up `layers` (or sideways between peer rooms)."""
    layers = layers or LAYERS[pkg]
    pkg_dir = root / pkg

    def rank(room: str) -> int:
        for i, layer in enumerate(layers):
            if room == layer or (isinstance(layer, tuple) and room in layer):
                return i
        return layers.index(ALGORITHM)

    bad = []
    for path in sorted(pkg_dir.rglob("*.py")):
        src = room_of(pkg_dir, list(path.relative_to(pkg_dir).parts))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name.split(".")[1:] for a in node.names if a.name.startswith(pkg + ".")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == pkg:
                    targets = [[a.name] for a in node.names]
                elif node.module.startswith(pkg + "."):
                    targets = [node.module.split(".")[1:]]
                else:
                    continue
            else:
                continue
            for parts in targets:
                dst = room_of(pkg_dir, parts)
                if dst != src and rank(dst) <= rank(src):
                    bad.append(f"{path.relative_to(root)}:{node.lineno} ({src}) imports {pkg}.{'.'.join(parts)} ({dst})")
    return bad


@pytest.mark.parametrize("pkg", sorted(LAYERS))
def test_imports_between_rooms_go_one_way(pkg):
    bad = upward_imports(pkg)
    assert not bad, f"{pkg}/: imports against the order {LAYERS[pkg]} (top to bottom):\n" + "\n".join(bad)


def test_rooms_are_listed():
    # A new sub-package must take its place in LAYERS (and say in its __init__ what it owns).
    for pkg, layers in LAYERS.items():
        folders = {p.name for p in (ROOT / pkg).iterdir() if p.is_dir() and any(p.glob("*.py"))}
        unlisted = folders - rooms_named(layers) if ALGORITHM not in layers else set()
        assert not unlisted, f"{pkg}/: place {sorted(unlisted)} in tests/test_boundaries.py LAYERS"
        for folder in folders:
            doc = ast.get_docstring(ast.parse((ROOT / pkg / folder / "__init__.py").read_text()))
            assert doc, f"{pkg}/{folder}/__init__.py needs a docstring: what it owns and what it may import"


@pytest.mark.parametrize("pkg", [*PACKAGES, "bench"])
def test_no_folder_holds_more_than_15_modules(pkg):
    crowded = {str(d.relative_to(ROOT)): n for d in [ROOT / pkg, *(p for p in (ROOT / pkg).rglob("*") if p.is_dir())]
               if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > MAX_MODULES}
    assert not crowded, f"group these modules into sub-packages by concern (at most {MAX_MODULES}): {crowded}"


def test_order_checker_sees_an_upward_import(tmp_path):
    # planning (bottom) importing the loop (above it), and one algorithm importing another, are caught;
    # the same imports the other way round are not.
    for rel, code in {"launch/cli.py": "from launch.loop import driver\n",
                      "launch/loop/driver.py": "from launch.planning.cluster import ClusterInfo\n",
                      "launch/planning/cluster.py": "import launch.loop.driver\n",
                      "algos/spec.py": "",
                      "algos/grpo/maths.py": "from algos import spec\nfrom algos.pure import steps\n",
                      "algos/pure/steps.py": "from algos.spec import get\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(code)
    assert upward_imports("launch", tmp_path) == [
        "launch/planning/cluster.py:1 (planning) imports launch.loop.driver (loop)"]
    assert upward_imports("algos", tmp_path) == ["algos/grpo/maths.py:2 (grpo) imports algos.pure (pure)"]
    # peer rooms of one layer (a tuple): a study importing another study, and the shared room importing a study,
    # are caught; a study importing the shared room is not
    for rel, code in {"bench/evidence/study.py": "from bench.common import runs\nfrom bench.chaos.monkey import M\n",
                      "bench/chaos/monkey.py": "import bench.common.runs\n",
                      "bench/common/runs.py": "from bench.evidence import study\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(code)
    assert upward_imports("bench", tmp_path, ["*", ("evidence", "chaos"), "common"]) == [
        "bench/common/runs.py:1 (common) imports bench.evidence (evidence)",
        "bench/evidence/study.py:2 (evidence) imports bench.chaos.monkey (chaos)"]
