"""Helpers for tests that run plain (vLLM-free) receivers as real subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_plain_receivers(address: tuple[str, int], names: list[str], *, pushes: int = 1,
                          checksum: bool = False) -> list[subprocess.Popen]:
    host, port = address
    procs = []
    for name in names:
        cmd = [sys.executable, "-m", "weightsync.plain_receiver", "--host", host, "--port", str(port),
               "--name", name, "--pushes", str(pushes)] + (["--checksum"] if checksum else [])
        procs.append(subprocess.Popen(cmd, cwd=ROOT, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
