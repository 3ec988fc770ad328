"""Starting the buffer service: a spawned child process of the launcher.

`start_buffer_process(cfg, advertise_host=..., secrets=...)` spawns the service (multiprocessing "spawn",
so no state leaks from the parent), waits until it has bound its socket and returns (process, address):
the address clients must use (the advertised one; where it binds is in its stats as `bind_address`).
The child gets its settings as a JSON string and reports its address as JSON bytes over a pipe; the
run's secrets (`RunSecrets.for_server()`: the server key pair and the admitted client public key) are a
`Process` argument, so they travel in multiprocessing's spawn pipe — never in argv, the environment or a
file. Nothing else is pickled but the `Process` object multiprocessing itself needs. The child exits on
SIGTERM or when its parent dies (it ignores SIGINT: see `_install_signals`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal

from buffer.auth import RunSecrets
from buffer.settings import BufferSettings


def _install_signals(service) -> None:
    """SIGTERM stops the service. SIGINT is ignored: a terminal's Ctrl-C reaches the whole process group,
    and the launcher still needs the buffer to drain the actors and snapshot it before it stops the
    child itself."""
    def stop(signum, frame):
        service.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _to_file(path: str) -> None:
    """This process's stdout and stderr (descriptors 1 and 2, so whatever writes there) append to `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _child_main(settings_json: str, conn, parent_pid: int, log_level: str, secrets: RunSecrets | None,
                restore: tuple[str, list] | None = None, log_path: str | None = None) -> None:
    if log_path is not None:
        _to_file(log_path)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from buffer.service import BufferService
    from buffer.snapshot import restore_snapshot

    info = {}
    try:
        service = BufferService(BufferSettings.from_json(settings_json), parent_pid=parent_pid, secrets=secrets)
        if restore is not None:  # before the first message is read: nothing a client sent is overwritten
            info = restore_snapshot(service.core, restore[0], exclude=restore[1])
    except Exception as e:
        conn.send_bytes(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        conn.close()
        return
    _install_signals(service)
    conn.send_bytes(json.dumps({"address": service.address, "restored": info}).encode())
    conn.close()
    service.serve_forever()


def start_buffer_process(cfg=None, batch_prompts: int | None = None, *, advertise_host: str | None = None,
                         secrets: RunSecrets | None = None, startup_timeout_s: float = 60.0,
                         log_level: str = "WARNING", restore: tuple[str, list] | None = None,
                         log_path: str | None = None, **overrides) -> tuple[mp.Process, str]:
    """Spawn the buffer service -> (process, the address clients must use). Stop it with `process.terminate()`.

    cfg: a RunConfig, a BufferConfig (then pass batch_prompts), a dict, a BufferSettings or None;
    `overrides` set BufferSettings fields.
    advertise_host: this node's IP as Ray reports it when the run spans several nodes (then `buffer.host:
    auto` binds every interface and clients are told this IP); None on one machine (loopback).
    secrets: the run's `RunSecrets` with the server's secret key (full, or `for_server()`): serve CURVE and
    admit only the run's client key. None = plain (tests).
    restore: (snapshot path, [(epoch, prompt_index), ...] not to restore): the new service loads the
    snapshot before it serves anyone (`buffer.snapshot.restore_snapshot`); what it restored is
    `process.restored` ({version, groups, excluded, demos}).
    log_path: the file the service's output (its log, warnings, a crash's traceback) is appended to; None =
    this process's stdout/stderr."""
    if advertise_host is not None:
        overrides["advertise_host"] = advertise_host
    settings = BufferSettings.from_config(cfg, batch_prompts, **overrides)
    if secrets is not None and not secrets.server_secret:
        raise ValueError("start_buffer_process(secrets=...): need the run's full RunSecrets (with the server's "
                         "secret key), not a client's public() copy")
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(settings.to_json(), send, os.getpid(), log_level,
                                                 secrets.for_server() if secrets else None, restore, log_path),
                       name="buffer-service", daemon=True)
    proc.start()
    send.close()
    try:
        if not recv.poll(startup_timeout_s):
            raise RuntimeError(f"buffer service did not report its address within {startup_timeout_s:.0f}s")
        msg = json.loads(recv.recv_bytes())
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"buffer service exited during start-up (exit code {proc.exitcode})") from None
    except BaseException:
        proc.terminate()
        raise
    finally:
        recv.close()
    if "error" in msg:
        proc.join(5)
        raise RuntimeError(f"buffer service failed to start: {msg['error']}")
    proc.restored = msg["restored"]
    return proc, msg["address"]
