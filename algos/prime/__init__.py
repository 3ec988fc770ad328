"""PRIME (`--algo prime`): `options` (torch-free), `prm` (the implicit process reward: λ smoothing,
normalisation, the PRM losses) and `maths` (RLOO over process and outcome rewards)."""
