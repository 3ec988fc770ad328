"""PACS (`--algo pacs`): `options` (torch-free) and `maths` (the implicit score, its group advantage, the
class weights and the BCE loss)."""
