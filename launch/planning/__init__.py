"""Planning on the cluster, before anything starts: what each node has (`cluster`), the resource plan and
its errors (`resources`), where each role and core goes (`placement`), and what a model needs in memory
and context (`model_shape`, `memory_estimate`). Imports no other launch package."""
