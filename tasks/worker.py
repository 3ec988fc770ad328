"""Run one named Python function in a killable child process, under a hard per-call time limit.

Why a process: a reward or answer checker may hang (math-verify evaluating a power tower, a user's
scorer in a loop) or crash, and a thread cannot be stopped; math-verify's own limit is `signal.alarm`,
which works only on the main thread (actors score off it). A child process can always be killed. Used
by `tasks.math_answers.MathVerifier` and `tasks.rewards.Scorer`.

Function names (`load_function`): ``module:function`` (an importable module; ``function`` may be
dotted) or ``path/to/file.py:function``. The child runs `main` with the parent's ``sys.path``, so it
imports what the parent can.

Protocol (stdin/stdout, UTF-8 JSON lines, no pickle): the child writes ``{"ready": true}`` once the
function is loaded (or ``{"error": ...}`` and exits); then for each request ``{"args": [...], "kwargs":
{...}}`` (kwargs optional) it writes ``{"value": v}`` or ``{"error": "Type: message"}``. EOF on stdin ends it. What the function
prints goes to stderr, never into the protocol.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_CHILD = "import sys; from tasks.worker import main; main(sys.argv[1])"


class WorkerTimeout(TimeoutError):
    """A call ran past its time limit (the worker was killed and is being restarted)."""


class WorkerError(RuntimeError):
    """The function raised (message: ``Type: message``), returned something not JSON, or the worker died."""


def load_function(name: str):
    """The function ``module:function`` or ``path/to/file.py:function`` names (raises ImportError,
    FileNotFoundError, AttributeError or TypeError when it cannot be loaded or is not callable)."""
    where, sep, attr = name.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"{name!r} is not module:function or path/to/file.py:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        spec = importlib.util.spec_from_file_location(f"_plugin_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{where} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{name} is a {type(obj).__name__}, not a function")
    return obj


class FunctionWorker:
    """Calls one function (`load_function` name) in a long-lived child process, one call at a time (a
    lock serialises threads). timeout_s: limit of one call (past it the child is killed, restarted in
    the background and `WorkerTimeout` raised); startup_timeout_s: limit for a (re)started child to load
    the function, not counted in the call's limit."""

    def __init__(self, name: str, timeout_s: float = 5.0, startup_timeout_s: float = 120.0) -> None:
        self.name, self.timeout_s, self.startup_timeout_s = name, timeout_s, startup_timeout_s
        self.timeouts = 0
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._lock = threading.Lock()

    def call(self, *args, kwargs: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        """fn(*args, **kwargs) in the child (arguments and result JSON: non-JSON values are sent as str).
        The keyword arguments come as one dict so that no name of theirs can clash with `timeout_s`."""
        request = json.dumps({"args": list(args), "kwargs": kwargs or {}}, default=str).encode() + b"\n"
        with self._lock:
            proc = self._worker()
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                reply = _read_line(proc, timeout_s or self.timeout_s)
            except OSError:  # the child died (BrokenPipeError)
                reply = b""
            if not reply:
                self._kill()
                self._start()  # warm up the replacement in the background
                if reply == b"":
                    raise WorkerError(f"the worker running {self.name} exited (code {proc.returncode})")
                self.timeouts += 1
                raise WorkerTimeout(f"{self.name} took longer than {timeout_s or self.timeout_s:g} s")
        out = json.loads(reply)
        if "error" in out:
            raise WorkerError(out["error"])
        return out["value"]

    def close(self) -> None:
        """Stop the child (a later call starts a new one)."""
        with self._lock:
            self._kill()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD, self.name], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env, bufsize=0)
        self._ready = False

    def _worker(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        if not self._ready:
            line = _read_line(self._proc, self.startup_timeout_s)
            if not line or "error" in json.loads(line):
                self._kill()
                why = json.loads(line)["error"] if line else (
                    "it exited" if line == b"" else f"no answer in {self.startup_timeout_s:g} s")
                raise WorkerError(f"the worker for {self.name} did not start: {why}")
            self._ready = True
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        self._ready = False


def load_plugin(name: str, where: str, error: type[Exception], example: str):
    """`load_function(name)` for a user's plugin (a reward function, a tool, an environment class): every way it
    can fail becomes `error` with one line starting with `where` and, for a module that is not found, the form
    that names a file instead (`example`)."""
    try:
        return load_function(name)
    except ModuleNotFoundError as e:
        raise error(f"{where}: {e} — install it or put its folder on PYTHONPATH, or name the file: {example}") from None
    except (ValueError, FileNotFoundError, AttributeError, TypeError) as e:
        raise error(f"{where}: {e}") from None
    except Exception as e:  # the module itself raised while being imported
        raise error(f"{where}: importing it raised {type(e).__name__}: {e}") from None


def _read_line(proc: subprocess.Popen, timeout_s: float) -> bytes | None:
    """One line from the child; None if none arrives within `timeout_s`, b"" if its stdout closed (it died)."""
    deadline = time.monotonic() + timeout_s
    fd = proc.stdout.fileno()
    chunks = b""
    while not chunks.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return b""
        chunks += chunk
    return chunks


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _plain(value: Any) -> float | str:
    """A value JSON cannot write: a number of another type (numpy) as a float, anything else as its str (a
    reward's dict may carry such entries beside the number the caller reads)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def main(name: str) -> None:
    """The child: answer requests on stdin with fn(*args, **kwargs) until EOF (module docstring)."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the function's prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(text: str) -> None:
        protocol.write(text + "\n")
        protocol.flush()

    try:
        fn = load_function(name)
    except Exception as e:
        send(json.dumps({"error": _error(e)}))
        return
    send(json.dumps({"ready": True}))
    for line in sys.stdin:
        try:
            request = json.loads(line)
            text = json.dumps({"value": fn(*request["args"], **request.get("kwargs", {}))}, default=_plain)
        except Exception as e:
            text = json.dumps({"error": _error(e)})
        send(text)
