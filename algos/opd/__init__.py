"""On-policy distillation (`--algo opd`): `options` (its options, rules and registration, torch-free) and
`maths` (the teacher's per-token reverse-KL advantage, optionally mixed with the reward's group advantage)."""
