"""The sandbox that runs policy-written Python (the `python` tool): the code is treated as hostile.

Each call runs in a fresh interpreter (`sys.executable -I -S envs/sandbox_child.py`), started without a shell,
with an environment of its own (nothing of the caller's, no token, is passed), stdin from /dev/null, and
stdout+stderr merged into one pipe the caller reads. Every limit is in place before the program's first line.
The call ends when the program's main process ends; whatever it left running is killed then.

What is enforced, and by which mechanism, in "namespaces" mode (root where unshare works: our machines and
CI). `describe_protections()` prints the line of what is actually active, probed by a real call:
- CPU time: RLIMIT_CPU = `cpu_s` per process (SIGXCPU, then SIGKILL one second later).
- Wall time: after `wall_s` the call's pid-namespace init is killed, and with it, by the kernel, every
  process of the namespace (forks included: no process can leave a pid namespace). The caller kills the
  sandbox's own process group `wall_s + 5 s` after the start should its supervisor not have returned.
- Memory: RLIMIT_AS = `memory_mb` of address space per process (a 100 GB allocation fails at once with
  MemoryError). The sum over the call's processes is bounded only by `max_processes × memory_mb`.
- Processes: RLIMIT_NPROC = `max_processes` (threads count too). It holds because the program runs as a uid
  of its own, one per call (drawn from 2_100_000_000 + [0, 1e6)), with no capabilities, no supplementary
  groups and NO_NEW_PRIVS (no set-uid binary can give privileges back; the binds are nosuid as well).
- Output: at most `output_bytes` of stdout+stderr are kept; past that the program is stopped and the
  result says the output was truncated.
- Network: a new network namespace with no interface up: no TCP/UDP connection and no abstract unix socket
  reaches the host (the buffer's port included); Landlock (ABI >= 4) refuses TCP bind/connect as well.
- Files: a private mount namespace whose root is a fresh tmpfs (`scratch_mb`) holding read-only binds of
  /usr, /lib*, /bin, /sbin, /etc and the interpreter's own folders (prefix, standard library, site-packages),
  /dev/{null,zero,random,urandom}, a /proc of the call's pid namespace, and /tmp, the scratch folder (cwd,
  HOME, TMPDIR), owned by the call's uid. The run folder (its key files included), the project, /root, the
  host's /tmp and every other path do not exist there; the tmpfs, and the scratch folder with it, vanishes
  when the call ends. RLIMIT_FSIZE caps one file at `scratch_mb`. Landlock (when the kernel has it) adds:
  reads only under the new "/", writes only in /tmp and /dev/shm (both in the tmpfs); signals and abstract
  sockets stay inside the call (ABI >= 6).
- IPC: a new IPC namespace (no System V shared memory or message queue of the host).
Not enforced: a cap on the memory or CPU time summed over the call's processes (no cgroup; the products
above and the wall limit bound them); a seccomp filter (the kernel's system calls are reachable, though the
kernel refuses a new user namespace inside a chroot, checked by a test); the program can read the interpreter's
installed packages (bound read-only so that it can import numpy or sympy; .pth files are not run).

"plain" mode (not root, or namespaces refused): a fresh process with RLIMIT_CPU, AS and FSIZE, and
RLIMIT_NPROC = the processes the uid already runs + `max_processes` (not for root, for whom the kernel
ignores it: the description then says "NOT limited"). The supervisor is the program's child subreaper: a
double fork or a new session stays below it, and at the end (or after `wall_s`) every descendant is killed.
Landlock, when available, restricts reads to the system and interpreter folders and writes to a scratch
folder the caller creates and deletes, refuses TCP (ABI >= 4), keeps signals and abstract sockets inside
(ABI >= 6) and forbids ptrace of the caller; without Landlock there is no file or network isolation, and the
description says so.

Overhead per call, `print(1)`, either mode (bench/sandbox_overhead.py, medians of 30 calls, 2 cores): 35 ms
against 9 ms for a bare `python -I -S` start when the machine is quiet, 77 ms against 16 ms at load 4; about
4-5 bare starts: the interpreter, two forks, the namespaces and mounts, the teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
UID_BASE, UID_SPAN = 2_100_000_000, 1_000_000  # one uid per call, drawn from here (no user owns these)
SUPERVISOR_GRACE_S = 5.0  # how long past wall_s the caller waits for the sandbox's own supervisor
MAX_CODE_BYTES = 1 << 20
MEMORY_EXIT, SETUP_EXIT = 101, 102  # exit statuses of the user process, as sandbox_child.py sets them


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed call. Units are in the names: seconds, megabytes (MiB), bytes, processes."""

    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU; whole seconds)
    wall_s: float = 10.0  # wall-clock seconds of the whole call, every process of it
    memory_mb: int = 1024  # address space per process, MiB (RLIMIT_AS)
    output_bytes: int = 8192  # stdout+stderr kept; past this the program is stopped and the output truncated
    max_processes: int = 16  # processes and threads of the call (RLIMIT_NPROC)
    scratch_mb: int = 64  # size of the scratch folder (tmpfs) and of any one file written (RLIMIT_FSIZE), MiB

    def __post_init__(self):
        for name in ("cpu_s", "memory_mb", "output_bytes", "max_processes", "scratch_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SandboxLimits.{name}={value!r}: must be a positive integer")
        if not self.wall_s > 0:
            raise ValueError(f"SandboxLimits.wall_s={self.wall_s!r}: must be a positive number of seconds")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb={self.memory_mb}: the interpreter needs at least 64 MiB")


@dataclass(frozen=True)
class SandboxResult:
    output: str  # stdout and stderr as the program wrote them (merged), truncated past output_bytes
    exit_status: int | None  # the program's exit status; -N when killed by signal N; None when not known
    limit: str | None  # the limit it ran into ("wall", "cpu", "memory", "output") or None
    error: str | None  # a short "error: ..." line for the model when the call did not end normally
    wall_s: float  # seconds from start to the end of the call, as the caller measured it

    def observation(self) -> str:
        """What the model sees: the output, then the error line when there is one."""
        text = self.output
        if self.error:
            text += ("" if not text or text.endswith("\n") else "\n") + self.error
        return text or "(no output)"


class SandboxSetupError(RuntimeError):
    """The sandbox could not apply the protections it was asked for; no program ran."""


class Sandbox:
    """Runs Python programs under `limits` in "namespaces" or "plain" mode ("auto": namespaces when root and
    they work, else plain). The mode is decided once, by a probe call, and never changes silently after.
    use_landlock=False leaves Landlock out even where the kernel has it (how the tests check the fallback
    of a kernel without it)."""

    def __init__(self, limits: SandboxLimits | None = None, mode: str = "auto", use_landlock: bool = True):
        if mode not in ("auto", "namespaces", "plain"):
            raise ValueError(f"Sandbox(mode={mode!r}): choose 'auto', 'namespaces' or 'plain'")
        self.limits = limits or SandboxLimits()
        self._mode: str | None = None if mode == "auto" else mode
        self._landlock: int | None = None if use_landlock else 0  # the Landlock ABI, 0 when absent; probed once
        self._refused = ""  # why "auto" did not get namespaces, for the description
        self._verified = False  # a call has run in this mode: the description is of something that works

    @property
    def mode(self) -> str:
        if self._mode is None:
            self._mode = "plain"
            if os.geteuid() == 0:
                try:
                    self._mode = "namespaces"
                    self.run("pass")
                except SandboxSetupError as e:
                    self._mode, self._refused = "plain", str(e)
        return self._mode

    @property
    def landlock_abi(self) -> int:
        if self._landlock is None:
            self._landlock = landlock_abi()
        return self._landlock

    def run(self, code: str) -> SandboxResult:
        """Run `code` as a Python 3 program; the result, whatever the program does. Raises SandboxSetupError
        only when the protections could not be put in place (no program ran)."""
        data = code.encode("utf-8", errors="replace")
        if len(data) > MAX_CODE_BYTES:
            return SandboxResult("", None, None, f"error: the program is longer than {MAX_CODE_BYTES} bytes", 0.0)
        mode, lim = self.mode, self.limits
        scratch = "" if mode == "namespaces" else tempfile.mkdtemp(prefix="sandbox-")
        cfg = {"mode": mode, "cpu_s": lim.cpu_s, "wall_s": lim.wall_s, "memory_mb": lim.memory_mb,
               "max_processes": lim.max_processes, "scratch_mb": lim.scratch_mb, "scratch": scratch,
               "uid": UID_BASE + secrets.randbelow(UID_SPAN), "landlock": int(self.landlock_abi > 0),
               "site_dirs": os.pathsep.join(d for d in site.getsitepackages() if os.path.isdir(d))}
        try:
            return self._run(data, cfg)
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)

    def _run(self, data: bytes, cfg: dict) -> SandboxResult:
        lim = self.limits
        status_r, status_w = os.pipe()
        cfg["status_fd"] = status_w
        start = time.monotonic()
        command = [sys.executable, "-I", "-S", str(CHILD), *(f"{k}={v}" for k, v in cfg.items())]
        try:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    pass_fds=(status_w,), start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        try:
            try:
                proc.stdin.write(data)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            output, status, truncated, backstop = _collect(proc, status_r, lim, start)
        finally:
            os.close(status_r)
            proc.stdout.close()
            _end(proc)
        elapsed = time.monotonic() - start
        if "setup_error" in status:
            raise SandboxSetupError(f"sandbox ({cfg['mode']} mode) could not start: {status['setup_error']}")
        text = output[: lim.output_bytes].decode("utf-8", errors="replace")
        self._verified = True
        exit_status, limit, error = _verdict(status, lim, truncated, backstop)
        if truncated:
            text += f"\n[output truncated at {lim.output_bytes} bytes]"
        return SandboxResult(text, exit_status, limit, error, elapsed)

    def describe(self) -> str:
        """One line: which protections are active (probed by a real call, not assumed), to print at a run's
        start. Raises SandboxSetupError when the mode asked for cannot run at all."""
        if not self._verified:
            self.run("pass")
        line = describe(self.mode, self.landlock_abi, self.limits)
        return f"{line}; namespaces refused: {self._refused}" if self._refused else line


def _collect(proc: subprocess.Popen, status_r: int, lim: SandboxLimits, start: float):
    """Read output (up to the cap) and status lines until both pipes end or the backstop deadline passes."""
    output, status_text = bytearray(), bytearray()
    truncated = backstop = False
    deadline = start + lim.wall_s + SUPERVISOR_GRACE_S
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, output)
        sel.register(status_r, selectors.EVENT_READ, status_text)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                backstop = True
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                elif key.data is output and not truncated:
                    output += chunk
                    if len(output) > lim.output_bytes:
                        truncated = True
                        _signal(proc, signal.SIGTERM)  # the supervisor kills the program's whole tree
                elif key.data is status_text:
                    status_text += chunk
    status: dict = {}  # key=value lines (sandbox_child._report); the statuses are integers
    for line in status_text.decode(errors="replace").splitlines():
        key, _, value = line.partition("=")
        status[key] = int(value) if key in ("user_status", "wall_exceeded") else value
    return bytes(output), status, truncated, backstop


def _signal(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)


def _end(proc: subprocess.Popen) -> None:
    """The supervisor is gone when this returns: waited for, or its whole process group killed."""
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _verdict(status: dict, lim: SandboxLimits, truncated: bool, backstop: bool):
    """(exit status, limit hit, error line) from the supervisor's report."""
    raw = status.get("user_status")
    code = None if raw is None else os.waitstatus_to_exitcode(raw)
    if truncated:
        return code, "output", f"error: output limit {lim.output_bytes} bytes exceeded; the program was stopped"
    if status.get("wall_exceeded") or backstop:
        return code, "wall", f"error: time limit {lim.wall_s:g} s exceeded (wall time); the program was stopped"
    if code == -signal.SIGXCPU:
        return code, "cpu", f"error: CPU time limit {lim.cpu_s} s exceeded; the program was stopped"
    if code == MEMORY_EXIT:
        return code, "memory", f"error: memory limit {lim.memory_mb} MB exceeded"
    if code is None:
        return None, None, "error: the sandbox ended without reporting the program's status"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"{-code}"
        return code, None, f"error: the program was killed by signal {name}"
    if code != 0:
        return code, None, f"exit status {code}" if code != 1 else None
    return 0, None, None


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none), asked of the kernel through syscall 444."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def describe(mode: str, landlock: int, lim: SandboxLimits) -> str:
    """The line of protections a sandbox in `mode` with Landlock ABI `landlock` (0: none) enforces."""
    parts = [f"sandbox ({mode} mode): fresh process per call", f"CPU {lim.cpu_s} s/process (RLIMIT_CPU)",
             f"memory {lim.memory_mb} MB/process (RLIMIT_AS)", f"output {lim.output_bytes} bytes"]
    if mode == "namespaces":
        parts += [f"wall {lim.wall_s:g} s (kills the call's pid namespace)",
                  f"{lim.max_processes} processes (RLIMIT_NPROC, own uid per call, no capabilities)",
                  "no network (empty network namespace" + (", Landlock TCP deny)" if landlock >= 4 else ")"),
                  f"files: private read-only root of system + Python folders, scratch tmpfs {lim.scratch_mb} MB "
                  "deleted after the call (mount namespace, chroot" + (f", Landlock ABI {landlock})" if landlock else ")")]
    else:
        parts.append(f"wall {lim.wall_s:g} s (kills the program's process tree: child subreaper)")
        parts.append(f"{lim.max_processes} processes (RLIMIT_NPROC)" if os.geteuid() != 0
                     else "process count NOT limited (root without namespaces)")
        if landlock:
            parts.append(f"files: reads only system + Python folders, writes only a scratch folder (Landlock ABI "
                         f"{landlock})")
            parts.append("no TCP (Landlock)" if landlock >= 4 else "network NOT isolated (Landlock ABI < 4)")
        else:
            parts.append("files and network NOT isolated (no Landlock, no namespaces)")
    return "; ".join(parts)


def describe_protections(limits: SandboxLimits | None = None) -> str:
    """The one-line description of the default sandbox's active protections (runs one probe call)."""
    return Sandbox(limits).describe()
