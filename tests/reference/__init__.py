"""Test oracles: ports of the reference implementations' rules that the package does not run itself
(the package runs its own owner of each rule; these check it, or document what the reference does)."""
