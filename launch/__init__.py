"""Orchestration: the `algo-train` command line and the function that wires the processes."""
