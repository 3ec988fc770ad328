"""Whole-system benchmarks of real `algo-train` runs: A/B of two settings (`ab`), learning per sample and second
(`learning`), mini-batches × epochs (`minibatch`), the staleness sweep (`staleness`), start-up (`startup`) and the
doctor on two hosts (`two_host_doctor`). May import `perf` and `common`."""
