"""What the benchmarks share: running a real `algo-train` and reading its metrics.jsonl, and the arithmetic of
their reports (`runs`), and CPU seconds a step by role (`cpu_roles`). Imports no other room."""
