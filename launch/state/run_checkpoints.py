"""The run's checkpoints, as the driver writes and resumes them: `checkpoints/step_<N>` holds the
learner ranks' part (`Learner.save`: weights, optimiser, RNG, learner_state.json), the buffer's
snapshot, and the driver's part, extra_state.json: the run's position (learner steps taken, which are
also the weight version, and the prompt ledger: `launch.state.position`). A checkpoint counts once committed
(`learner.committed`); a resume restores all three, so no prompt is skipped or trained twice.

A disk that fills during a save (ENOSPC, or a quota: EDQUOT, however Ray or the buffer wrapped it; or
any failure with under 16 MiB left on the run's filesystem: torch.save's C++ writer reports a full disk
as 'iostream error') stops the run cleanly: the staged checkpoint (and a half-written HF export) is deleted to give the space
back, the committed checkpoints are untouched, and `DiskFull` (a `StorageError`: one console line, no
traceback) names the folder, the last complete checkpoint and the command that continues from it.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

from buffer.records import Key
from launch.state.ledger import PromptLedger
from launch.state.position import RunPosition
from launch.state.storage import StorageError
from learner.committed import committed_steps

SNAPSHOT = "buffer.msgpack"
FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(StorageError):
    """The run's disk filled while a checkpoint was written (module docstring)."""


LOW_SPACE = 16 << 20  # bytes: a save that failed with less than this left is a full disk


def free_bytes(path: Path) -> int:
    """Bytes this process may still write on the filesystem of `path` (large when unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def disk_full(e: BaseException | None) -> bool:
    """Whether `e` (or what it wraps: a Ray task error, a buffer reply) is a full disk or quota."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in FULL or any(
                text in str(e) for text in ("No space left on device", "Disk quota exceeded")):
            return True
        e = e.__cause__ or e.__context__
    return False


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
        try:
            return self._save(export)
        except Exception as e:
            if not (disk_full(e) or free_bytes(self.run_dir) < LOW_SPACE):  # torch.save names no errno
                raise
        # raised out here, without the failed write's frames: a file it left open is closed (space freed)
        step = self.position.step
        for tmp in (self.run_dir / "checkpoints" / f".step_{step}.tmp", self.run_dir / "hf" / f".step_{step}.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back
        found = committed_steps(self.run_dir / "checkpoints")
        kept = (f"the last complete checkpoint, {self.run_dir / 'checkpoints' / f'step_{found[-1][0]}'}, is intact — "
                f"free space, then continue from it: algo-train --resume {self.run_dir}") if found else \
            "no complete checkpoint was written before — free space, then start over with --force"
        raise DiskFull(f"the disk holding {self.run_dir} is full (no space left on device) while writing checkpoint "
                       f"step_{step}; {kept}")

    def _save(self, export: bool) -> Path:
        from learner import checkpoint as ckpts

        root, step = self.run_dir / "checkpoints", self.position.step
        final = root / f"step_{step}"
        staged = ckpts.stage(final)
        # groups the buffer discarded since the last pull are settled: the ledger records them now, not at
        # the next pull (which a final checkpoint never sees; it would report them again, harmlessly)
        pending = self.recovery.call_on_live_buffer(lambda c: c.stats()).get("discarded_pending", [])
        self.position.ledger.discard(pending)
        self.graph.save(staged, {"step": step, "ledger": self.position.ledger.state_dict(), "buffer_snapshot": SNAPSHOT})
        began = time.time()
        # through the live buffer: one that died meanwhile is restarted first (`Recovery.call_on_live_buffer`)
        self.recovery.call_on_live_buffer(lambda c: c.snapshot(str((staged / SNAPSHOT).resolve())))
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
