"""Entry point of a training run (wiring lands with the end-to-end issue; see README)."""

from __future__ import annotations

import sys

from configs.schema import RunConfig


def train(cfg: RunConfig) -> int:
    print(f"algo-train: the {cfg.algo} configuration is valid, but this build does not yet wire actors, buffer "
          "and learner together; run with --dry-run to see the resolved configuration.", file=sys.stderr)
    return 3
