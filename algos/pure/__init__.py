"""PURE (`--algo pure`): `options` (torch-free), `steps` (step splitting, the min-form transform, credit
assignment) and `maths` (the baselines and the fusion with the verifiable reward)."""
