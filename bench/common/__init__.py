"""What the benchmarks share: running a real `algo-train` and reading its metrics.jsonl, and the arithmetic of
their reports (`runs`); CPU seconds a step by role (`cpu_roles`); the statistics a verdict rests on (`stats`:
t tests with their degrees of freedom, McNemar and the paired bootstrap over prompts, power, and the four
verdict words). Imports no other room."""
