"""Where a run is: the learner steps it has taken and the prompts they settled (`launch.state.ledger`).

The step count is the one owner of the weight version: one weight push per learner step, so the
version the actors must serve is the step count. The buffer, the actors and the checkpoints are told
it; none of them keeps a count of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launch.state.ledger import PromptLedger


@dataclass
class RunPosition:
    step: int = 0  # learner steps taken
    ledger: PromptLedger = field(default_factory=PromptLedger)

    @property
    def version(self) -> int:
        """The weight version the actors must serve: the learner steps taken."""
        return self.step
