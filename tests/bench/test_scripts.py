"""bench/'s scripts and the paths the docs give for them: every script answers `--help` when run by its path from
the repository root (each puts the root on sys.path itself), and every bench/ path that bench/RESULTS.md,
README.md or docs/*.md names, as a link or as a path in the text, exists."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_boundaries import ROOT, files

SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in files("bench") if '__name__ == "__main__"' in p.read_text())
DOCS = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
# written by a script when it runs, not kept in the repository (a default output path the docs name)
OUTPUTS = {"bench/ab_results.md"}


def test_scripts_are_found():
    assert len(SCRIPTS) >= 25 and "bench/evidence/evidence.py" in SCRIPTS, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_answers_help_from_the_repository_root(script):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script must find the root itself
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage:"), f"{script} --help: {out.stderr[-2000:]}"


def named_bench_paths(doc: Path) -> set[str]:
    """bench/ paths `doc` names, relative to the repository root: markdown links (relative to `doc`) and
    repository paths in the text (`bench/...` with a file suffix; not `tests/bench/...`)."""
    text = doc.read_text()
    found = set()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:|#", target):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if path.is_relative_to(ROOT / "bench"):
            found.add(str(path.relative_to(ROOT)))
    found |= set(re.findall(r"(?<![\w./-])(bench/[\w/.-]*\w\.(?:py|md|png|json))", text))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_bench_paths_in_the_docs_exist(doc):
    missing = sorted(p for p in named_bench_paths(doc) - OUTPUTS if not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names bench/ paths that do not exist: {missing}"


def test_path_finder_can_fail(tmp_path, monkeypatch):
    doc = ROOT / "docs" / "x.md"  # never written: the finder only reads the text given
    monkeypatch.setattr(Path, "read_text", lambda self: "[a](../bench/RESULTS.md#top) `bench/e2e/ab.py --a` "
                        "tests/bench/test_ab.py [b](https://x/bench/y.md) python bench/nowhere.py")
    assert named_bench_paths(doc) == {"bench/RESULTS.md", "bench/e2e/ab.py", "bench/nowhere.py"}
