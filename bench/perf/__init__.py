"""Micro-benchmarks of one component against a bare baseline measured in the same run (ratios, not absolute times):
the actor vs bare vLLM, the buffer vs bare ZMQ, the learner vs a plain torch loop, packing, weight sync, delta
pushes, engine batching and start-up, load memory, and the control plane's scale simulation. May import `common`."""
