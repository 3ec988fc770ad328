"""LUFFY (`--algo luffy`): `options` (torch-free), `prefix` (prefix ratios and guided rows, used by the
actors), `loss` (the mixed on/off-policy token loss and policy shaping) and `maths` (the advantage and the
registered losses)."""
