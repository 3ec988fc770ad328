"""The sandbox's own process: run as `python -I -S sandbox_child.py key=value ...`, the program on stdin.

Started by `envs/sandbox.py` (read its docstring for what is enforced). Standard library only, and nothing
from the project: this file runs as a script in a fresh interpreter. Three processes in "namespaces" mode:

    outer (root, the caller's child) -- unshare(mount, network, pid, ipc); builds the private root on /tmp;
      |                                 enforces the wall time by killing the pid namespace's init
      +-- init (pid 1 of the new pid namespace, root) -- mounts /proc, chroot, waits for the user process;
            |                                            when it exits the kernel kills every process left
            +-- user process -- rlimits, Landlock, drops to the call's uid, then runs the program

In "plain" mode (no namespaces) the outer process, a child subreaper, forks the user process directly (in its
own process group) and at the end kills every process still below it.
Every limit is applied before the first line of the program runs; a layer that was asked for and cannot be
applied aborts the call (status "setup_error") instead of running the program with less protection.
Reports go to the caller as key=value lines on the status pipe (fd given in the config), never on stdout.
Nothing here imports json, re or traceback before the program runs: each costs milliseconds of every call.
"""

import contextlib
import ctypes
import os
import resource
import signal
import struct
import sys
import threading

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWIPC = 0x00020000, 0x40000000, 0x20000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc")
DEVICES = ("null", "zero", "random", "urandom")
NEW_ROOT = "/tmp"  # in the private mount namespace a fresh tmpfs is mounted here and becomes "/"
SCRATCH_IN_ROOT = "/tmp"  # the program's scratch folder (cwd, HOME, TMPDIR) as the program sees it
MEMORY_EXIT = 101  # the user process's exit status after a MemoryError (spoofable: it only picks a message)
SETUP_EXIT = 102
TRACEBACK_FRAMES, TRACEBACK_CHARS = 8, 2000

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(number: int, *args) -> int:
    return libc.syscall(ctypes.c_long(number), *args)


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _report(fd: int, key: str, value) -> None:
    os.write(fd, f"{key}={str(value).replace(chr(10), ' ')}\n".encode())


def parse_config(args: list[str]) -> dict:
    """The call's settings from `key=value` arguments (envs/sandbox.py writes them)."""
    cfg: dict = dict(a.split("=", 1) for a in args)
    for key in ("cpu_s", "memory_mb", "scratch_mb", "max_processes", "uid", "status_fd"):
        cfg[key] = int(cfg[key])
    cfg["wall_s"] = float(cfg["wall_s"])
    cfg["landlock"] = cfg["landlock"] == "1"
    cfg["site_dirs"] = [d for d in cfg["site_dirs"].split(os.pathsep) if d]
    return cfg


def python_dirs(site_dirs: list[str]) -> list[str]:
    """Where this interpreter reads its standard library and packages (paths as `sys.path` spells them)."""
    found = [sys.base_prefix, sys.prefix] + [p for p in sys.path[1:] if p] + site_dirs
    return [p for p in dict.fromkeys(os.path.abspath(p) for p in found) if os.path.isdir(p)]


def _outermost(paths: list[str]) -> list[str]:
    kept: list[str] = []
    for p in sorted(paths):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


def build_private_root(scratch_mb: int, uid: int, site_dirs: list[str]) -> None:
    """In a fresh mount namespace: a tmpfs on /tmp becomes the new root, holding read-only binds of the system
    and Python folders, four devices and an empty scratch folder owned by `uid`. Nothing else is visible."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, f"size={scratch_mb}m,mode=0755")
    for d in SYSTEM_DIRS:
        target = NEW_ROOT + d
        if os.path.islink(d):
            os.symlink(os.readlink(d), target)
        elif os.path.isdir(d):
            os.mkdir(target)
            _bind_read_only(d, target)
    for d in _outermost([p for p in python_dirs(site_dirs) if not any(p.startswith(s + "/") for s in SYSTEM_DIRS)]):
        os.makedirs(NEW_ROOT + d, exist_ok=True)
        _bind_read_only(os.path.realpath(d), NEW_ROOT + d)
    os.mkdir(NEW_ROOT + "/dev")
    for name in DEVICES:
        open(f"{NEW_ROOT}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{NEW_ROOT}/dev/{name}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{NEW_ROOT}/dev/{name}")
    os.symlink("/proc/self/fd", f"{NEW_ROOT}/dev/fd")
    os.mkdir(f"{NEW_ROOT}/dev/shm", 0o1777)
    os.chmod(f"{NEW_ROOT}/dev/shm", 0o1777)
    os.mkdir(NEW_ROOT + "/proc")
    os.mkdir(NEW_ROOT + SCRATCH_IN_ROOT, 0o700)
    os.chown(NEW_ROOT + SCRATCH_IN_ROOT, uid, uid)


def apply_landlock(read_only: list[str], writable: list[str], writable_files: list[str]) -> int:
    """Landlock: every file access outside these paths is refused, TCP bind/connect are refused (ABI >= 4),
    and signals and abstract unix sockets leave the domain only inward (ABI >= 6). Returns the ABI applied."""
    abi = _syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    fs = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | (FS_IOCTL_DEV if abi >= 5 else 0)
    net = 3 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP, with no rule that allows any port
    scoped = 3 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = struct.pack("=QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _check(_syscall(SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
    rules = [(p, READ_ONLY) for p in read_only] + [(p, fs) for p in writable] + [(p, file_rights) for p in writable_files]
    for path, access in rules:
        if not os.path.exists(path):
            continue
        access &= fs if os.path.isdir(path) else fs & file_rights
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            rule = struct.pack("=Qi", access, fd)
            _check(_syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                            rule, ctypes.c_uint32(0)), f"landlock_add_rule {path}")
        finally:
            os.close(fd)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
           "prctl(NO_NEW_PRIVS)")
    _check(_syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "landlock_restrict_self")
    os.close(ruleset)
    return abi


def processes_of(uid: int) -> int:
    """How many processes (threads count too, for RLIMIT_NPROC) uid runs now, read from /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def set_rlimits(cfg: dict, proc_limit: int | None) -> None:
    mb = 1 << 20
    limits = [(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1),  # SIGXCPU at the soft limit, SIGKILL 1 s later
              (resource.RLIMIT_AS, cfg["memory_mb"] * mb, cfg["memory_mb"] * mb),
              (resource.RLIMIT_FSIZE, cfg["scratch_mb"] * mb, cfg["scratch_mb"] * mb),
              (resource.RLIMIT_NOFILE, 256, 256), (resource.RLIMIT_CORE, 0, 0)]
    if proc_limit is not None:
        limits.append((resource.RLIMIT_NPROC, proc_limit, proc_limit))
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def run_program(code: str, site_dirs: list[str]) -> None:
    """Run the program as __main__; a traceback is trimmed to the program's own last frames. Never returns.
    The interpreter started without `site` (-S, 35 ms faster): the packages' folders are added here, without
    running their .pth files (no editable install of the project, no start-up hooks)."""
    sys.path[0] = os.getcwd()
    sys.path += [d for d in site_dirs if d not in sys.path]
    sys.stdout.reconfigure(line_buffering=True)
    status = 0
    try:
        exec(compile(code, "<python>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # the program's own error: show it as Python would, shorter
        import linecache
        import traceback

        sys.stdout.flush()
        linecache.cache["<python>"] = (len(code), None, code.splitlines(True), "<python>")
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next, limit=-TRACEBACK_FRAMES))
        if len(text) > TRACEBACK_CHARS:
            text = "[traceback trimmed]\n..." + text[-TRACEBACK_CHARS:]
        sys.stderr.write(text)
        status = MEMORY_EXIT if isinstance(e, MemoryError) else 1
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status & 0xFF)


def user_process(cfg: dict, code: str, status_fd: int) -> None:
    """The process that runs the program: every limit first, then the program. Never returns."""
    os.close(status_fd)
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
                   "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
           "prctl(NO_NEW_PRIVS)")  # no set-uid binary or file capability can give privileges back
    if cfg["mode"] == "namespaces":
        scratch, uid = SCRATCH_IN_ROOT, cfg["uid"]
        set_rlimits(cfg, cfg["max_processes"])
        if cfg["landlock"]:
            apply_landlock(["/"], [scratch, "/dev/shm"], ["/dev/null", "/dev/zero"])  # both in the private tmpfs
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:
        scratch = cfg["scratch"]
        os.setpgid(0, 0)
        nproc = None if os.geteuid() == 0 else processes_of(os.geteuid()) + cfg["max_processes"]
        set_rlimits(cfg, nproc)
        if cfg["landlock"]:
            dirs = python_dirs(cfg["site_dirs"])
            apply_landlock(list(SYSTEM_DIRS) + dirs + [os.path.realpath(p) for p in dirs],
                           [scratch], ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"])
    os.chdir(scratch)
    os.environ.clear()
    os.environ.update(environment, HOME=scratch, TMPDIR=scratch)
    run_program(code, cfg["site_dirs"])


def namespace_init(cfg: dict, code: str, status_fd: int) -> None:
    """pid 1 of the call's pid namespace: mounts /proc, enters the private root, runs and reaps the user process.
    When it exits the kernel kills every process left in the namespace. Never returns."""
    libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    _mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chroot(NEW_ROOT)
    os.chdir("/")
    pid = os.fork()
    if pid == 0:
        _guarded(user_process, cfg, code, status_fd)
    _, status = os.waitpid(pid, 0)
    _report(status_fd, "user_status", status)
    os._exit(0)


def descendants(root: int) -> list[int]:
    """Every process below `root`, from the parent ids in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_descendants() -> None:
    """Plain mode: as the child subreaper, whatever the program left (a double fork, a new session) is still
    below this process; kill it all, again until nothing is left, reaping as it goes."""
    for _ in range(1000):
        left = descendants(os.getpid())
        if not left:
            return
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def _guarded(body, cfg: dict, code: str, status_fd: int) -> None:
    """Run a forked child's body; a failure before the program starts is reported, never run around."""
    try:
        body(cfg, code, status_fd)
    except BaseException as e:
        try:
            _report(status_fd, "setup_error", f"{body.__name__}: {type(e).__name__}: {e}")
        except OSError:
            sys.stderr.write(f"sandbox setup failed: {type(e).__name__}: {e}\n")
        os._exit(SETUP_EXIT)


def main() -> None:
    cfg = parse_config(sys.argv[1:])
    status_fd = cfg["status_fd"]
    code = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    namespaces = cfg["mode"] == "namespaces"
    try:
        if namespaces:
            _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
            build_private_root(cfg["scratch_mb"], cfg["uid"], cfg["site_dirs"])
        else:  # orphans of the program are re-parented here, not to the host's init
            _check(libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    except OSError as e:
        _report(status_fd, "setup_error", f"{cfg['mode']} mode: {e}")
        sys.exit(SETUP_EXIT)
    # a SIGTERM from the caller (output over its cap) that comes before the handler exists waits, blocked
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        _guarded(namespace_init if namespaces else user_process, cfg, code, status_fd)
    if not namespaces:
        with contextlib.suppress(OSError):  # also done by the child; whichever runs first wins the race
            os.setpgid(child, child)
    stopped = []

    def stop(signum, _frame):
        stopped.append(signum)
        # the namespace's init takes its namespace with it; in plain mode the program's process group (the
        # rest of its tree is killed after the wait)
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL) if namespaces else os.killpg(child, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.setitimer(signal.ITIMER_REAL, cfg["wall_s"])
    _, status = os.waitpid(child, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    if not namespaces:
        _report(status_fd, "user_status", status)
        kill_descendants()
    _report(status_fd, "wall_exceeded", int(signal.SIGALRM in stopped))


if __name__ == "__main__":
    main()
