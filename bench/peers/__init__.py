"""Ours against a peer framework: the quick-start against TRL's `GRPOTrainer` on the same run (`peer_trl` drives
both, `peer_trl_run` is the TRL side, `peer_trl_report` the pure arithmetic and table). May import `perf` and
`common`."""
