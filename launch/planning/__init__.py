"""Planning on the cluster, before anything starts: what each node has (`cluster`), the resource plan and
its errors (`resources`), where each role and core goes (`placement`), and what a model needs in memory
and context (`model_shape`, `memory_estimate`), whether the staleness credit keeps the GPU engines busy
(`engine_load`), and the one vLLM release the code is written against
(`versions`: checked by `launch.prep.preflight` and the doctor). Imports no other launch package."""
