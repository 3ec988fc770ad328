"""SFT warm-up (`--algo sft`): `options` (registration, torch-free) and `maths` (token NLL on
demonstrations)."""
