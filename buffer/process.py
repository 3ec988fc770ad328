"""Starting the buffer service: a spawned child process for the launcher, or a command line.

`start_buffer_process(cfg, advertise_host=..., secrets=...)` spawns the service (multiprocessing "spawn",
so no state leaks from the parent), waits until it has bound its socket and returns (process, address):
the address clients must use (the advertised one; where it binds is in its stats as `bind_address`).
The child gets its settings as a JSON string and reports its address as JSON bytes over a pipe; the
run's secrets (`RunSecrets.for_server()`: the server key pair and the admitted client public key) are a
`Process` argument, so they travel in multiprocessing's spawn pipe — never in argv, the environment or a
file. Nothing else is pickled but the `Process` object multiprocessing itself needs. The child exits on
SIGTERM/SIGINT or when its parent dies.

`python -m buffer.service --config buffer.json [--port N] [--max-staleness K] [--batch-prompts B]` runs it
in the foreground and prints one JSON line {"address": ..., "bind_address": ...} once bound. The JSON holds
either the `buffer:` fields of the run config (optionally with `learner: {batch_prompts}`) or a flat map of
`BufferSettings` fields; the buffer reads JSON rather than YAML because it imports no config library. The
command line serves without authentication (it has no way to receive keys safely): keep it on loopback.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import sys

from buffer.auth import RunSecrets
from buffer.settings import BufferSettings


def _install_signals(service, managed: bool = False) -> None:
    """SIGTERM stops the service. SIGINT does too when run from the command line; a child of the
    launcher ignores it, because a terminal's Ctrl-C reaches the whole process group and the launcher
    still needs the buffer to drain the actors and snapshot it before it stops the child itself."""
    def stop(signum, frame):
        service.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN if managed else stop)


def _child_main(settings_json: str, conn, parent_pid: int, log_level: str, secrets: RunSecrets | None,
                restore: tuple[str, list] | None = None) -> None:
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
    _install_signals(service, managed=True)
    conn.send_bytes(json.dumps({"address": service.address, "restored": info}).encode())
    conn.close()
    service.serve_forever()


def start_buffer_process(cfg=None, batch_prompts: int | None = None, *, advertise_host: str | None = None,
                         secrets: RunSecrets | None = None, startup_timeout_s: float = 60.0,
                         log_level: str = "WARNING", restore: tuple[str, list] | None = None,
                         **overrides) -> tuple[mp.Process, str]:
    """Spawn the buffer service -> (process, the address clients must use). Stop it with `process.terminate()`.

    cfg: a RunConfig, a BufferConfig (then pass batch_prompts), a dict, a BufferSettings or None;
    `overrides` set BufferSettings fields.
    advertise_host: this node's IP as Ray reports it when the run spans several nodes (then `buffer.host:
    auto` binds every interface and clients are told this IP); None on one machine (loopback).
    secrets: the run's `RunSecrets` with the server's secret key (full, or `for_server()`): serve CURVE and
    admit only the run's client key. None = plain (tests, the command line).
    restore: (snapshot path, [(epoch, prompt_index), ...] not to restore): the new service loads the
    snapshot before it serves anyone (`buffer.snapshot.restore_snapshot`); what it restored is
    `process.restored` ({version, groups, excluded, demos})."""
    if advertise_host is not None:
        overrides["advertise_host"] = advertise_host
    settings = BufferSettings.from_config(cfg, batch_prompts, **overrides)
    if secrets is not None and not secrets.server_secret:
        raise ValueError("start_buffer_process(secrets=...): need the run's full RunSecrets (with the server's "
                         "secret key), not a client's public() copy")
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(settings.to_json(), send, os.getpid(), log_level,
                                                 secrets.for_server() if secrets else None, restore),
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m buffer.service", description="Run the replay buffer service.")
    ap.add_argument("--config", help="JSON file: {'buffer': {...}, 'learner': {'batch_prompts': B}} or flat fields")
    ap.add_argument("--host", help="auto (loopback), 0.0.0.0 or an IPv4 address to bind")
    ap.add_argument("--advertise-host", help="the address clients are told (this node's IP), when it differs")
    ap.add_argument("--port", type=int)
    ap.add_argument("--max-staleness", type=int)
    ap.add_argument("--batch-prompts", type=int)
    ap.add_argument("--capacity-groups", type=int)
    ap.add_argument("--filter", choices=("none", "extreme", "accuracy_window"))
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    data = {}
    if args.config:
        try:
            with open(args.config) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"--config: cannot read {args.config} as JSON: {e}", file=sys.stderr)
            return 2
    overrides = {k: v for k, v in {"host": args.host, "advertise_host": args.advertise_host, "port": args.port,
                                   "max_staleness": args.max_staleness,
                                   "batch_prompts": args.batch_prompts, "capacity_groups": args.capacity_groups,
                                   "filter": args.filter}.items() if v is not None}
    try:
        settings = BufferSettings.from_config(data, **overrides)
    except (ValueError, TypeError) as e:
        print(f"buffer settings: {e}", file=sys.stderr)
        return 2
    from buffer.service import BufferService

    service = BufferService(settings)
    _install_signals(service)
    print(json.dumps({"address": service.address, "bind_address": service.bind_address}), flush=True)
    service.serve_forever()
    return 0
