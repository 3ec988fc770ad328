"""Prepare the step-by-step testbed as its first run does (`algo-train --algo pure --testbed steps`: the warm model,
then PURE's learned PRM; `launch.prep.testbed`) and report its figures as one JSON line: seconds of each part, the
warm-up's accuracy checks and where it stopped, the warm model's greedy held-out accuracy on every level, the
PRM's step accuracy (held-out samples of the warm policy) and its training loss. Cached parts are found, not
rebuilt, and their recorded figures are reported (`warmup.json`, `prm_report.json` in their directories).

  .venv/bin/python bench/evidence/testbed_prep.py                       # the testbed as shipped
  .venv/bin/python bench/evidence/testbed_prep.py --set seed=1          # another seed's warm model and PRM
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    from launch.prep.testbed import build_testbed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = p.parse_args(argv)
    start = time.monotonic()
    warm, prm = build_testbed("steps", "pure", {}, args.overrides, log=lambda m: print(m, file=sys.stderr, flush=True))
    out = {"seconds": round(time.monotonic() - start, 1), "warm_model": str(warm), "prm": str(prm)}
    for name, path in (("warmup", warm / "warmup.json"), ("prm_report", prm / "prm_report.json")):
        out[name] = json.loads(path.read_text()) if path.is_file() else None
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
