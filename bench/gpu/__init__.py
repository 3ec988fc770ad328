"""The GPU checks: `gpu_smoke` (one command that runs every GPU step in order, each as its own script or test
file, and writes one report) and `gpu_learner` (the learner on one GPU against a plain loop). May import `perf`
and `common`."""
