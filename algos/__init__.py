"""Every algorithm: its options and rules (torch-free `algos/<name>_options.py`, which also register it),
and its pure tensor maths (`algos/<name>.py`): advantages, losses, credit assignment.

Importing `algos` loads the registry only (`algos.spec`: no torch). The maths imports nothing but torch
(a test enforces it). Shapes: B rows (responses), T padded response width, G groups (prompts); masks
are [B, T] with 1 on response tokens.
"""

from algos.spec import PROX, AlgoSpec, LossComponent, Maths, get, names, register

__all__ = ["PROX", "AlgoSpec", "LossComponent", "Maths", "get", "names", "register"]
