"""Per-call overhead of the Python tool's sandbox (`envs/sandbox.py`), against the bare interpreter start.

Times, alternately within one run: a bare `python -I -S -c "print(1)"` subprocess (what any process-per-call
runner pays), and `Sandbox.run("print(1)")` in each mode this machine supports ("namespaces": namespaces,
private root, own uid, Landlock; "plain": rlimits + Landlock). Prints the median wall milliseconds of each
and the ratio to the bare start.

    python bench/sandbox_overhead.py [--calls 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.sandbox import Sandbox, SandboxSetupError  # noqa: E402


def bare() -> None:
    subprocess.run([sys.executable, "-I", "-S", "-c", "print(1)"], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="calls timed per variant")
    args = parser.parse_args()
    variants = {"bare interpreter": bare}
    for mode in ("namespaces", "plain"):
        box = Sandbox(mode=mode)
        try:
            box.run("pass")
        except SandboxSetupError as e:
            print(f"{mode}: unavailable ({e})")
            continue
        variants[f"sandbox {mode}"] = lambda box=box: box.run("print(1)")
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.calls):
        for name, call in variants.items():
            t = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times["bare interpreter"])
    print(f"{os.cpu_count()} CPUs, {args.calls} calls each, medians:")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:<20} {m * 1e3:7.1f} ms   x{m / base:.2f} of the bare start")


if __name__ == "__main__":
    main()
