"""Which checkpoint directories count: a `step_<N>` directory holding the COMMITTED marker, which
`learner.checkpoint.commit` writes last. The one statement of that rule, torch-free, so a launcher
that only asks "how far did this run get" (`launch.state.rundir`) answers without importing torch."""

from __future__ import annotations

import re
from pathlib import Path

COMMITTED = "COMMITTED"
_STEP_DIR = re.compile(r"step_(\d+)")


def is_committed(path: str | Path) -> bool:
    return (Path(path) / COMMITTED).is_file()


def committed_steps(root: str | Path) -> list[tuple[int, Path]]:
    """(N, directory) of every committed `step_<N>` under `root`, oldest first ([] when `root` is missing)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), d) for d in root.iterdir()
                  if (m := _STEP_DIR.fullmatch(d.name)) and is_committed(d))
