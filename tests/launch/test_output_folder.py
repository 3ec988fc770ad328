"""An `--output` folder the run cannot write (a read-only filesystem, a file in place of a folder) stops
the launch with one line naming the folder and the fix, before anything starts: no traceback, exit
status 2, and nothing left behind (`launch.commands.train.check_writable`). Each way fails for root too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_in_place_of_a_parent_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "runs").write_text("not a folder")
    out = tmp_path / "runs" / "a" / "b"
    assert main(["--algo", "grpo", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"algo-train: --output {out}: cannot write there (Not a directory: {tmp_path / 'runs' / 'a'}) — "
                   "choose a folder you can write to with --output DIR\n")


def test_the_check_leaves_nothing_behind(tmp_path, capsys):
    from launch.commands.train import check_writable

    check_writable(tmp_path / "new" / "run", resuming=False)  # writable: passes, and creates nothing
    assert not any(tmp_path.iterdir())
    (tmp_path / "old").mkdir()
    check_writable(tmp_path / "old", resuming=True)
    assert not any((tmp_path / "old").iterdir())


def read_only_mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not read_only_mount_works(), reason="needs `unshare -rm` (a private mount namespace)")
def test_output_on_a_read_only_filesystem_is_one_line(tmp_path):
    """`algo-train --output` under a read-only bind mount, in a private mount namespace (`unshare -rm`)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    out = ro / "run"
    script = (f"mount --bind -o ro {ro} {ro} && exec {sys.executable} -m launch.cli --algo grpo "
              f"--output {out}")
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr == (f"algo-train: --output {out}: cannot write there (Read-only file system) — choose a folder "
                        "you can write to with --output DIR\n")
    assert "Traceback" not in p.stdout and not out.exists()
