"""The disk fills during a checkpoint write: the run stops with one clear line (`DiskFull`, a
StorageError: the supervisor prints it without a traceback), the staged checkpoint is removed (its
space given back), and the previous committed checkpoint still loads. A real full filesystem: a small
tmpfs (needs root and mount; skipped with the reason otherwise). No vLLM, no Ray: the run-folder code
(`launch.state.run_checkpoints.RunCheckpoints.save`, `learner.checkpoint` stage/commit) with a stand-in for
the learner ranks that writes a tensor file as they do."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from launch.state.position import RunPosition
from launch.state.run_checkpoints import SNAPSHOT, DiskFull, RunCheckpoints, disk_full
from launch.state.storage import StorageError
from learner.checkpoint import latest_checkpoint


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


class Learner:
    """Writes the learner ranks' part as torch tensors (`size` floats), like `Learner.save`."""

    def __init__(self):
        self.size = 1000

    def save(self, staged: Path, extra: dict) -> None:
        torch.save({"w": torch.arange(self.size, dtype=torch.float32)}, staged / "model.pt")
        (staged / "extra_state.json").write_text(str(extra))


def test_a_disk_filling_during_a_checkpoint_leaves_the_previous_one_loadable(small_disk):
    run = small_disk / "run"
    run.mkdir()
    learner, position = Learner(), RunPosition()
    client = SimpleNamespace(snapshot=lambda path: Path(path).write_bytes(b"snapshot"),
                             stats=lambda: {"discarded_pending": []})
    said: list[str] = []
    ckpts = RunCheckpoints(run, learner, SimpleNamespace(client=client, call_on_live_buffer=lambda call: call(client)), position,
                           SimpleNamespace(message=said.append), keep=3)
    position.step = 4
    first = ckpts.save()
    assert first == run / "checkpoints" / "step_4" and (first / SNAPSHOT).is_file()

    position.step, learner.size = 8, 1_000_000  # 4 MB of weights on a 2 MB disk
    with pytest.raises(DiskFull) as err:
        ckpts.save()
    assert isinstance(err.value, StorageError)  # the supervisor prints it as one line: algo-train: <message>
    assert str(err.value) == (
        f"the disk holding {run} is full (no space left on device) while writing checkpoint step_8; the last "
        f"complete checkpoint, {first}, is intact — free space, then continue from it: algo-train --resume {run}")
    assert "\n" not in str(err.value)
    assert latest_checkpoint(run / "checkpoints") == first
    assert not (run / "checkpoints" / ".step_8.tmp").exists()  # the space is given back
    assert torch.equal(torch.load(first / "model.pt")["w"], torch.arange(1000, dtype=torch.float32))
    position.step, learner.size = 9, 1000  # with space again, the run checkpoints as before
    assert ckpts.save() == latest_checkpoint(run / "checkpoints") == run / "checkpoints" / "step_9"


def test_disk_full_is_recognised_through_wrappers():
    class RayTaskError(RuntimeError):
        pass

    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as inner:
            raise RayTaskError("learner rank 0 failed") from inner
    except RayTaskError as e:
        assert disk_full(e)
    assert disk_full(RuntimeError("snapshot: cannot write /x: [Errno 28] No space left on device"))
    assert not disk_full(OSError(13, "Permission denied"))
