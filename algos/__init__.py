"""Every algorithm, a folder each: its options and rules (torch-free `algos/<name>/options.py`, which also
registers it) and its pure tensor maths (`algos/<name>/maths.py` and what that splits off): advantages,
losses, credit assignment. The pieces algorithms share sit here, beside the folders: the registry and its
contract (`spec`), the step's batch (`batch`), option fields (`options`), masked reductions (`masked`),
aggregation, baselines, importance weights, PPO clipping, the policy-gradient term, overlong shaping and
returns. An algorithm's folder may import these and nothing of another algorithm's folder; these import
no algorithm (`tests/test_boundaries.py`).

Importing `algos` loads the registry only (`algos.spec`: no torch). The maths imports nothing but torch
(a test enforces it). Shapes: B rows (responses), T padded response width, G groups (prompts); masks
are [B, T] with 1 on response tokens.
"""

from algos.spec import PROX, AlgoSpec, LossComponent, Maths, get, names, register

__all__ = ["PROX", "AlgoSpec", "LossComponent", "Maths", "get", "names", "register"]
