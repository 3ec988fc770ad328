"""Pure tensor maths of every algorithm: advantages, losses, credit assignment, and the registry.

Imports nothing but torch (a test enforces it). Shapes: B rows (responses), T padded response width,
G groups (prompts); masks are [B, T] with 1 on response tokens.
"""

from algos.registry import AlgoSpec, LossComponent, LossContext, LossTerm, StepBatch, get, names, register

__all__ = ["AlgoSpec", "LossComponent", "LossContext", "LossTerm", "StepBatch", "get", "names", "register"]
