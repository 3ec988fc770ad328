"""Environments and tools for multi-turn rollouts: what a policy's turn acts on and what comes back.

A rollout actor (`actors/`) runs the turns; this package owns what sits outside the policy: the
environment interface a user implements, tools written as plain Python functions, the built-in tools
(an exact calculator, a sandboxed Python runner) and the sandbox that runs policy-written code.
It imports neither vLLM nor torch.
"""
