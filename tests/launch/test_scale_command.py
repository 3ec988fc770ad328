"""`algo-train scale RUN_DIR --actors N` (`launch.commands.scale`) and its request file
(`launch.state.scaling`): what is refused before anything is written, and what the run reads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from launch.cli import main
from launch.state.scaling import REQUEST, read_request, write_request


def _live_run(tmp_path, pid: int = os.getpid()):
    (tmp_path / "processes.json").write_text(json.dumps({"driver": {"pid": pid, "host": socket.gethostname()},
                                                         "actor/0": {}, "actor/1": {}}))
    return tmp_path


def test_a_request_is_read_once_and_a_broken_one_is_no_request(tmp_path):
    assert read_request(tmp_path, None) == (None, None)  # none written
    path = write_request(tmp_path, 3)
    asked, seen = read_request(tmp_path, None)
    assert asked == 3 and seen == path.stat().st_mtime
    assert read_request(tmp_path, seen) == (None, seen)  # the same request: not again
    (tmp_path / REQUEST).write_text('{"actors": ')  # a writer caught mid-write
    os.utime(tmp_path / REQUEST, (seen + 5, seen + 5))
    assert read_request(tmp_path, seen) == (None, seen)


def test_the_command_asks_a_live_run(tmp_path, capsys):
    run = _live_run(tmp_path)
    assert main(["scale", str(run), "--actors", "4"]) == 0
    assert json.loads((run / REQUEST).read_text())["actors"] == 4
    assert capsys.readouterr().out.startswith(f"[scale] asked the run at {run} for 4 actors (it lists 2)")


def test_the_command_refuses_what_holds_no_live_run(tmp_path, capsys):
    assert main(["scale", str(tmp_path), "--actors", "2"]) == 2
    assert "holds no running run (no processes.json)" in capsys.readouterr().out
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run = _live_run(tmp_path, pid=int(gone.stdout))  # that process has exited
    assert main(["scale", str(run), "--actors", "2"]) == 2
    assert capsys.readouterr().out.strip().endswith(f"`algo-train --resume {run} --actors N` continues it with N actors")
    _live_run(tmp_path)
    assert main(["scale", str(run), "--actors", "0"]) == 2
    assert "a run needs at least 1 actor" in capsys.readouterr().out
    (run / "summary.json").write_text("{}")
    assert main(["scale", str(run), "--actors", "2"]) == 2
    assert f"{run} has finished (summary.json)" in capsys.readouterr().out
    assert not (run / REQUEST).exists()  # nothing was asked of any of them
