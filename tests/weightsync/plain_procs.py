"""Helpers for tests that run plain (vLLM-free) receivers as real subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_plain_receivers(address: tuple[str, int], names: list[str], *, token: str, pushes: int = 1,
                          checksum: bool = False, freeze_before_ack: bool = False) -> list[subprocess.Popen]:
    """One `weightsync.gloo.plain_receiver` process per name; each reads `token` from its stdin."""
    host, port = address
    procs = []
    for name in names:
        cmd = [sys.executable, "-m", "weightsync.gloo.plain_receiver", "--host", host, "--port", str(port),
               "--name", name, "--pushes", str(pushes)] + (["--checksum"] if checksum else []) \
            + (["--freeze-before-ack"] if freeze_before_ack else [])
        p = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        p.stdin.write(token.encode() + b"\n")
        p.stdin.close()
        procs.append(p)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
