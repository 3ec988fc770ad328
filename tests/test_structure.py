"""The package's shape, checked on the source: files a reader can hold, folders without import circles,
and a configuration layer that loads without torch (so `algo-train --dry-run` and config validation are
instant, and a new algorithm's options are read without its maths).
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_boundaries import PACKAGES, ROOT, files

MAX_LINES = 400


def package_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in files(pkg)]


def test_no_package_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in package_files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility (limit {MAX_LINES} lines): {long}"


def sibling_imports(path: Path, pkg: str) -> set[str]:
    """Modules of the same folder `pkg` (dotted, at any depth: "launch.prep") that `path` imports anywhere: top
    level, inside a function, or under `if TYPE_CHECKING:` (a type two modules need belongs in a third, not in
    one of them)."""
    def child(module: str) -> str:  # "launch.prep.testbed_prm.x" -> "testbed_prm"
        return module[len(pkg) + 1:].split(".")[0]

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {child(a.name) for a in node.names if a.name.startswith(pkg + ".")}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.module == pkg:
                found |= {a.name for a in node.names}
            elif node.module and node.module.startswith(pkg + "."):
                found.add(child(node.module))
    return found


def import_graph(pkg: str, root: Path = ROOT) -> dict[str, set[str]]:
    mods = {p.stem: p for p in sorted((root / pkg.replace(".", "/")).glob("*.py"))}
    return {m: (sibling_imports(p, pkg) & set(mods)) - {m} for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


FOLDERS = sorted({".".join(p.parent.relative_to(ROOT).parts) for p in [*package_files(), *files("bench")]})


@pytest.mark.parametrize("pkg", FOLDERS)
def test_no_import_circle_inside_a_folder(pkg):
    found = circles(import_graph(pkg))
    assert not found, f"{pkg}/ has import circles (modules that import each other, directly or around): {found}"


def test_circle_finder_can_fail(tmp_path):
    # a -> b -> c -> a is one circle (one of them through __init__'s `from pkg import x`); d stands alone.
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from p.a import A\n")
    (pkg / "a.py").write_text("from p.b import B\nA = 1\n")
    (pkg / "b.py").write_text("def f():\n    from .c import C\nB = 2\n")
    (pkg / "c.py").write_text("from p import a\nC = 3\n")
    (pkg / "d.py").write_text("import os\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.f import F\n")
    (pkg / "f.py").write_text("from p.e import E\n")
    graph = import_graph("p", tmp_path)
    assert graph["d"] == set()
    assert circles(graph) == [["a", "b", "c"], ["e", "f"]]
    # a folder inside a folder (launch.prep before issue 43): g imports h inside a function, h imports g at the
    # top, both by their full dotted names; i imports a module of the outer folder only
    sub = pkg / "q"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    (sub / "g.py").write_text("def build():\n    from p.q.h import H\n")
    (sub / "h.py").write_text("import p.q.g\nH = 1\n")
    (sub / "i.py").write_text("from p.q import g\nfrom p import d\nimport p.a\n")
    nested = import_graph("p.q", tmp_path)
    assert nested == {"__init__": set(), "g": {"h"}, "h": {"g"}, "i": {"g"}}
    assert circles(nested) == [["g", "h"]]


def test_configs_load_and_validate_without_torch():
    code = ("import sys; from configs.loading import resolve\n"
            "for algo in ('grpo', 'rloo', 'prime', 'pure', 'luffy', 'pacs', 'sft'): resolve(algo)\n"
            "print(sorted(m for m in ('torch', 'vllm', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"importing configs loaded {out.stdout.strip()}"


def test_architecture_doc_names_only_paths_that_exist():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = {m for m in re.findall(r"`([^`\s]+)`", doc)
             if "/" in m and "<" not in m and re.search(r"(\.py|\.md|\.yaml|/)$", m)}
    assert len(named) >= 30, f"the map names few paths: {sorted(named)}"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
    # every room of launch/ is on the map
    rooms = {f"launch/{p.name}/" for p in (ROOT / "launch").iterdir() if (p / "__init__.py").exists()}
    assert rooms <= named, f"rooms missing from docs/architecture.md: {sorted(rooms - named)}"
