"""A command line for one buffer service in the foreground (tests only; runs use
`buffer.process.start_buffer_process`).

`python -m tests.buffer.service_cli --config buffer.json [--port N] [--max-staleness K] [--batch-prompts B]`
prints one JSON line {"address": ..., "bind_address": ...} once bound, and stops on SIGTERM or SIGINT.
The JSON holds either the `buffer:` fields of the run config (optionally with `learner: {batch_prompts}`) or a
flat map of `BufferSettings` fields. It serves without authentication (a command line has no way to receive
keys safely): keep it on loopback.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from buffer.service import BufferService
from buffer.settings import FILTERS, BufferSettings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.buffer.service_cli", description="Run one buffer service.")
    ap.add_argument("--config", help="JSON file: {'buffer': {...}, 'learner': {'batch_prompts': B}} or flat fields")
    ap.add_argument("--host", help="auto (loopback), 0.0.0.0 or an IPv4 address to bind")
    ap.add_argument("--advertise-host", help="the address clients are told (this node's IP), when it differs")
    ap.add_argument("--port", type=int)
    ap.add_argument("--max-staleness", type=int)
    ap.add_argument("--batch-prompts", type=int)
    ap.add_argument("--capacity-groups", type=int)
    ap.add_argument("--filter", choices=FILTERS)
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
    service = BufferService(settings)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: service.stop())
    print(json.dumps({"address": service.address, "bind_address": service.bind_address}), flush=True)
    service.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
