"""How the suite splits over two pytest-xdist workers (`scripts/test.sh` runs `pytest -n 2 --dist loadgroup`).

Each top-level folder of tests/ is one group, run by one worker, so a folder's session fixtures (its shared
vLLM engine, its tiny model) start once. tests/e2e and tests/cluster are one group, "runs", collected
first: they start whole `algo-train` runs and two-host network namespaces, one at a time, while the other
worker goes through every other folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
RUNS = ("e2e", "cluster")


def group_of(path: Path) -> str:
    parts = path.resolve().relative_to(TESTS).parts
    folder = parts[0] if len(parts) > 1 else "top"
    return "runs" if folder in RUNS else folder


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(Path(item.fspath))))
    items.sort(key=lambda item: group_of(Path(item.fspath)) != "runs")  # stable: the runs first
