"""Hostile programs in the sandbox: each attack of issue 39 is stopped and reported, and the caller goes on.

Every test runs in each mode this machine supports: "namespaces" (root: pid/net/mount/ipc namespaces, private
root, own uid, Landlock), the same without Landlock (a kernel without it) and "plain" (rlimits + Landlock). A mode, or a layer a test relies on, that the machine lacks
is skipped with the reason; `describe()` must then not claim it either (tests/envs/test_sandbox_basics.py).
"""

import os
import socket
import time
import uuid
from dataclasses import replace

import pytest

from envs.sandbox import SUPERVISOR_GRACE_S, UID_BASE, UID_SPAN, Sandbox, SandboxLimits, SandboxSetupError

LIMITS = SandboxLimits(cpu_s=1, wall_s=1.5, memory_mb=256, output_bytes=2000, max_processes=8, scratch_mb=16)


@pytest.fixture(scope="module", params=["namespaces", "namespaces-without-landlock", "plain"])
def box(request):
    mode, _, without = request.param.partition("-without-")
    if mode == "namespaces" and os.geteuid() != 0:
        pytest.skip("namespaces mode needs root")
    sandbox = Sandbox(LIMITS, mode=mode, use_landlock=not without)
    try:
        sandbox.run("pass")
    except SandboxSetupError as e:
        pytest.skip(str(e))
    return sandbox


def needs_landlock(box, abi=1, what="file isolation"):
    if box.mode == "plain" and box.landlock_abi < abi:
        pytest.skip(f"plain mode without Landlock ABI >= {abi}: no {what} (describe() says so)")


def sandbox_processes() -> list[int]:
    """Processes on this machine that belong to a sandbox: a per-call uid, or the sandbox's own supervisor."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if UID_BASE <= uid < UID_BASE + UID_SPAN or b"sandbox_child.py" in cmd:
            found.append(int(entry))
    return found


def test_fork_bomb_is_capped_and_killed_with_the_whole_tree(box):
    if box.mode == "plain" and os.geteuid() == 0:
        pytest.skip("plain mode as root: RLIMIT_NPROC does not apply to root (describe() says NOT limited)")
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('forks', n, 'errno', e.errno, flush=True)\n"
        "while True:\n"  # the bomb proper: every process forks for ever
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n")
    t = time.monotonic()
    r = box.run(code)
    elapsed = time.monotonic() - t
    # the spinning main process meets its CPU limit (1 s) or the call its wall limit (1.5 s) first: either ends
    # the call, and the kernel then kills the namespace's every process (plain mode: the subreaper does)
    assert r.limit in ("cpu", "wall") and "limit" in r.observation().splitlines()[-1], r
    assert elapsed < LIMITS.wall_s + SUPERVISOR_GRACE_S
    first = r.output.split()
    forks = int(first[first.index("forks") + 1])
    assert forks < LIMITS.max_processes and first[first.index("errno") + 1] == "11"  # EAGAIN: RLIMIT_NPROC
    assert sandbox_processes() == []  # the sleepers and the bomb's processes are all gone
    assert box.run("print(6 * 7)").output == "42\n"  # the caller goes on


def test_infinite_loop_stops_at_the_cpu_limit(box):
    # a wall limit far above the CPU limit, so that a loaded machine cannot make the wall limit come first
    r = Sandbox(replace(LIMITS, wall_s=30.0), mode=box.mode, use_landlock=box.landlock_abi > 0).run("while True:\n    pass")
    assert r.limit == "cpu" and r.observation().endswith("error: CPU time limit 1 s exceeded; the program was stopped")


def test_sleeping_program_stops_at_the_wall_limit(box):
    t = time.monotonic()
    r = box.run("import time\nprint('start', flush=True)\ntime.sleep(60)")
    assert r.limit == "wall" and r.output.startswith("start") and time.monotonic() - t < LIMITS.wall_s + SUPERVISOR_GRACE_S
    assert sandbox_processes() == []


def test_a_100_gb_allocation_fails_with_a_memory_error(box):
    r = box.run("x = bytearray(100 * 2**30)\nprint('allocated')")
    assert r.limit == "memory" and "MemoryError" in r.output and "allocated" not in r.output
    assert r.observation().endswith("error: memory limit 256 MB exceeded")


def test_no_connection_reaches_a_listening_port_on_loopback(box):
    needs_landlock(box, 4, "network isolation")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # stands for the buffer's ZMQ port
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        r = box.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                    f"s.sendall(b'steal')\nprint('connected')")
        assert "connected" not in r.output and ("PermissionError" in r.output or "OSError" in r.output), r
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected


def test_the_run_folders_key_files_cannot_be_read(box, tmp_path):
    needs_landlock(box)
    run = tmp_path / "run"  # a run folder: a secret as a key would be written (0600), a config as files are (0644)
    run.mkdir()
    key, config = run / "buffer_keys.json", run / "config.yaml"
    key.write_text("SECRET-KEY-MATERIAL")
    key.chmod(0o600)
    config.write_text("SECRET-CONFIG")
    config.chmod(0o644)
    code = "\n".join(f"try:\n    print(open({str(p)!r}).read())\nexcept OSError as e:\n    print('denied', type(e).__name__)"
                     for p in (key, config)) + f"\nimport os\ntry:\n    print(os.listdir({str(run)!r}))\n" \
                     "except OSError as e:\n    print('denied', type(e).__name__)"
    r = box.run(code)
    assert "SECRET" not in r.output and "buffer_keys" not in r.output
    assert r.output.count("denied") == 3, r.output


def test_writes_outside_the_scratch_folder_do_not_land(box, tmp_path):
    needs_landlock(box)
    tag = uuid.uuid4().hex
    targets = [tmp_path / "escaped.txt", f"/var/tmp/escaped-{tag}", f"/dev/shm/escaped-{tag}",
               os.path.join(os.getcwd(), f"escaped-{tag}")]
    code = "\n".join(f"try:\n    open({str(p)!r}, 'w').write('x')\n    print('wrote')\nexcept OSError as e:\n"
                     f"    print('denied', type(e).__name__)" for p in targets)
    code += "\nopen('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\nimport os\nprint(os.getcwd())"
    r = box.run(code)
    assert all(not os.path.exists(p) for p in targets)  # nothing lands on the host
    # the host's own folders are refused outright (/var/tmp and /dev/shm: namespaces mode has private ones, in
    # its tmpfs, gone with the call)
    assert r.output.splitlines()[0].startswith("denied") and r.output.splitlines()[3].startswith("denied"), r.output
    scratch = r.output.split()[-1]
    assert r.output.split()[-2] == "ok"  # the scratch folder itself is writable
    assert box.run("import os\nprint(sorted(os.listdir('.')))").output == "[]\n"  # and fresh on every call
    if box.mode == "plain":
        assert not os.path.exists(scratch)  # deleted after the call (namespaces: a tmpfs gone with its namespace)


def test_an_output_flood_is_truncated_and_stopped(box):
    r = box.run("while True:\n    print('x' * 1000)")
    assert r.limit == "output"
    assert r.output.endswith(f"[output truncated at {LIMITS.output_bytes} bytes]")
    assert len(r.output.encode()) <= LIMITS.output_bytes + 60
    assert r.observation().endswith(f"error: output limit {LIMITS.output_bytes} bytes exceeded; the program was stopped")


def test_a_normal_program_gets_its_stdout_and_stderr(box):
    r = box.run("import sys\nprint('hello', 2 + 3)\nprint('warn', file=sys.stderr)")
    assert r.output == "hello 5\nwarn\n" and r.exit_status == 0 and r.error is None and r.limit is None


def test_an_exception_returns_its_trimmed_traceback(box):
    r = box.run("def f(n):\n    return f(n + 1) if n < 50 else 1 / 0\nprint('before')\nf(0)")
    lines = r.output.splitlines()
    assert lines[0] == "before" and lines[-1] == "ZeroDivisionError: division by zero" and r.exit_status == 1
    assert "sandbox_child" not in r.output and 'File "<python>", line 2, in f' in r.output
    assert r.output.count("in f\n") <= 8  # the last 8 frames of 51
    assert r.observation() == r.output  # an exception is the program's output, not a sandbox error


def test_the_callers_environment_does_not_leak(box, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    r = box.run("import os\nprint(sorted(os.environ))\nprint(os.environ.get('HF_TOKEN'))")
    assert "hf_secret_value" not in r.output and r.output.splitlines()[-1] == "None"


def test_namespaces_mode_hides_the_host(box):
    if box.mode != "namespaces":
        pytest.skip("only the namespaces mode has a private root and pid namespace")
    r = box.run(f"import os\nprint(os.getuid() >= {UID_BASE}, os.path.exists({__file__!r}), os.path.exists('/root/.bashrc'),"
                f" os.path.exists('/proc/{os.getpid()}'), sorted(p for p in os.listdir('/proc') if p.isdigit()))")
    own_uid, this_file, bashrc, caller, pids = r.output.split(" ", 4)
    assert (own_uid, this_file, bashrc, caller) == ("True", "False", "False", "False"), r.output
    assert pids.strip() == "['1', '2']"  # the namespace's init and the program: no host process is visible
    # no way back to privileges: a new user namespace is refused inside the chroot (EPERM)
    r = box.run("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "print(libc.unshare(0x10000000), ctypes.get_errno())")  # CLONE_NEWUSER
    assert r.output == "-1 1\n", r.output
