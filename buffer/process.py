"""Starting the buffer service: a spawned child process for the launcher, or a command line.

`start_buffer_process(cfg)` spawns the service (multiprocessing "spawn", so no state leaks from the
parent), waits until it has bound its socket and returns (process, address). The child gets its settings
as a JSON string and reports its address as JSON bytes over a pipe — nothing is pickled but the
`Process` object multiprocessing itself needs. The child exits on SIGTERM/SIGINT or when its parent dies.

`python -m buffer.service --config buffer.json [--port N] [--max-staleness K] [--batch-prompts B]` runs it
in the foreground and prints one JSON line {"address": ...} once bound. The JSON holds either the
`buffer:` fields of the run config (optionally with `learner: {batch_prompts}`) or a flat map of
`BufferSettings` fields; the buffer reads JSON rather than YAML because it imports no config library.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import sys

from buffer.settings import BufferSettings


def _install_signals(service, managed: bool = False) -> None:
    """SIGTERM stops the service. SIGINT does too when run from the command line; a child of the
    launcher ignores it, because a terminal's Ctrl-C reaches the whole process group and the launcher
    still needs the buffer to drain the actors and snapshot it before it stops the child itself."""
    def stop(signum, frame):
        service.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN if managed else stop)


def _child_main(settings_json: str, conn, parent_pid: int, log_level: str) -> None:
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from buffer.service import BufferService

    try:
        service = BufferService(BufferSettings.from_json(settings_json), parent_pid=parent_pid)
    except Exception as e:
        conn.send_bytes(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        conn.close()
        return
    _install_signals(service, managed=True)
    conn.send_bytes(json.dumps({"address": service.address}).encode())
    conn.close()
    service.serve_forever()


def start_buffer_process(cfg=None, batch_prompts: int | None = None, *, startup_timeout_s: float = 60.0,
                         log_level: str = "WARNING", **overrides) -> tuple[mp.Process, str]:
    """Spawn the buffer service. `cfg`: a RunConfig, a BufferConfig (then pass batch_prompts), a dict, a
    BufferSettings or None; `overrides` set BufferSettings fields. Stop it with `process.terminate()`."""
    settings = BufferSettings.from_config(cfg, batch_prompts, **overrides)
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(settings.to_json(), send, os.getpid(), log_level),
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
    return proc, msg["address"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m buffer.service", description="Run the replay buffer service.")
    ap.add_argument("--config", help="JSON file: {'buffer': {...}, 'learner': {'batch_prompts': B}} or flat fields")
    ap.add_argument("--host")
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
    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "max_staleness": args.max_staleness,
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
    print(json.dumps({"address": service.address}), flush=True)
    service.serve_forever()
    return 0
