"""Benchmarks and studies: what the system costs and whether the algorithms do what their papers say. Results and
the commands that made them: bench/RESULTS.md (with the evidence tables and plots beside it).

Every script runs from the repository root by its path, e.g. `.venv/bin/python bench/e2e/ab.py --help`; each puts
the root on `sys.path` itself. Rooms, top to bottom (a module imports its own room or one below it; the rooms of
the top row are peers and import none of each other; tests/test_boundaries.py LAYERS checks it):

  evidence/ chaos/ peers/ e2e/ gpu/   the studies and whole-system benchmarks
  perf/                               micro-benchmarks of one component against a bare baseline
  common/                             running `algo-train` and reading its metrics, CPU by role, statistics
"""
