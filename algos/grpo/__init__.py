"""GRPO and RLOO (`--algo grpo`, `--algo rloo`): `options` (their options, rules and registration, torch-free)
and `maths` (group baselines over the outcome reward with the shared policy-gradient loss)."""
