"""The run's checkpoints, as the driver writes and resumes them: `checkpoints/step_<N>` holds the
learner ranks' part (`Learner.save`: weights, optimiser, RNG, learner_state.json), the buffer's
snapshot, and the driver's part, extra_state.json: the run's position (learner steps taken, which are
also the weight version, and the prompt ledger: `launch.position`). A checkpoint counts once committed
(`learner.committed`); a resume restores all three, so no prompt is skipped or trained twice.
"""

from __future__ import annotations

import time
from pathlib import Path

from buffer.records import Key
from launch.ledger import PromptLedger
from launch.position import RunPosition

SNAPSHOT = "buffer.msgpack"


class RunCheckpoints:
    """graph: saves and loads the learner's part; recovery: the live buffer (its client and held prompts);
    keep: `learner.keep_checkpoints`; keeper: told of each snapshot taken (None: no buffer process of ours)."""

    def __init__(self, run_dir: Path, graph, recovery, position: RunPosition, progress, keep: int, keeper=None):
        self.run_dir, self.graph, self.recovery, self.position = run_dir, graph, recovery, position
        self.progress, self.keep, self.keeper = progress, keep, keeper
        self.resumed_from: tuple[Path, ...] = ()  # the checkpoint this run resumed from (never rotated out)

    def save(self, export: bool = False) -> Path:
        """checkpoints/step_<step>: staged in .step_<step>.tmp, where the learner ranks write their part
        and the buffer service its snapshot, then committed (its COMMITTED marker written last) and older
        checkpoints rotated out (`keep`; never the one this run resumed from). With `export`, the policy
        is then written as an HF model to hf/step_<step> (`learner.checkpoint`)."""
        from learner import checkpoint as ckpts

        root, step = self.run_dir / "checkpoints", self.position.step
        final = root / f"step_{step}"
        staged = ckpts.stage(final)
        self.graph.save(staged, {"step": step, "ledger": self.position.ledger.state_dict(), "buffer_snapshot": SNAPSHOT})
        began = time.time()
        self.recovery.client.snapshot(str((staged / SNAPSHOT).resolve()))
        ckpt = ckpts.commit(staged, final)
        if self.keeper is not None:
            self.keeper.taken(ckpt / SNAPSHOT, began)
        ckpts.rotate(root, self.keep, protect=self.resumed_from)
        if export:
            ckpts.export_hf(ckpt, self.run_dir / "hf" / f"step_{step}")
        return ckpt

    def restore(self, resume_dir: Path) -> list[Key]:
        """Load the latest checkpoint of `resume_dir` into the learner, the buffer and the run's position;
        returns the prompts the actors must skip (trained already, or held by the restored buffer)."""
        from learner.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(resume_dir / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"--resume {resume_dir}: no complete checkpoint under {resume_dir}/checkpoints "
                                    "(complete = a step_<N> directory holding the COMMITTED marker)")
        self.resumed_from = (ckpt,)
        extra = self.graph.load(ckpt)
        self.position.step = int(extra["step"])
        self.position.ledger = ledger = PromptLedger.from_state_dict(extra["ledger"])
        began = time.time()
        self.recovery.client.restore(str(ckpt / extra["buffer_snapshot"]))
        if self.keeper is not None:  # the buffer's state as of now, until the first timer snapshot
            self.keeper.taken(ckpt / extra["buffer_snapshot"], began)
        self.recovery.client.set_version(self.position.version)
        held = self.recovery.held_prompts()
        self.progress.message(f"[resume] {ckpt}: step {self.position.step}, version {self.position.version}, "
                              f"{len(ledger.trained)} prompts trained, {len(held)} held by the buffer")
        return ledger.accepted(held)
