"""Actor throughput vs bare vLLM, on one engine, same prompts, same run.

What is compared (generated tokens per second, wall clock):
  bare   AsyncLLM.generate with exactly the actor's SamplingParams (n samples per prompt, logprobs=0,
         seeds, final-only output, no detokenisation), the same number of prompts in flight, and
         nothing else: no grouping, no log-prob/version extraction, no reward, no buffer.
  actor  the full actor path (actors.actor.RolloutActor): credit from a real buffer process, group
         sampling, behaviour log-probs and per-token versions, reward scoring, and the push of every
         group to the buffer (the run ends when the buffer acknowledged the last group).
  bare_all_at_once (reported, not the goal) every prompt submitted at once (offline-style batching).
Phases alternate in ABBA order (bare, actor | actor, bare | ...) after a warm-up of both paths, so
machine noise and drift hit both; the ratio actor/bare is taken per pair and its median reported.
Goal: ratio >= 0.9.

Run:  .venv/bin/python bench/perf/actor_bench.py [--prompts 64 --n 8 --max-tokens 128 --reps 3]
Prints one JSON object per line (phases, then a summary with "ratio_median").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


async def bare(engine, items, n: int, max_tokens: int, in_flight: int | None, seed: int) -> int:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    sem = asyncio.Semaphore(in_flight or len(items))
    tokens = 0

    async def one(k, item):
        nonlocal tokens
        params = SamplingParams(n=n, temperature=1.0, top_p=1.0, max_tokens=max_tokens, logprobs=0,
                                flat_logprobs=True, seed=seed + 1000 * k, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        async with sem:
            async for out in engine.generate({"prompt_token_ids": list(item.prompt_ids)}, params,
                                             request_id=f"bare-{seed}-{k}"):
                final = out
        tokens += sum(len(c.token_ids) for c in final.outputs)

    await asyncio.gather(*(one(k, it) for k, it in enumerate(items)))
    return tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF model dir (default: build the tiny model in a temp dir)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()

    from actors.actor import RolloutActor
    from actors.engine import EngineSpec
    from actors.host import EngineHost
    from actors.prompts import items_from_records, load_tokenizer
    from buffer.process import start_buffer_process
    from configs.schema import RunConfig
    from tasks import build_tiny_model, problem_records, sample_problems

    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model or str(build_tiny_model(Path(tmp.name) / "tiny"))
    cfg = RunConfig()
    cfg.rollout.n, cfg.rollout.max_response_tokens = args.n, args.max_tokens
    cfg.rollout.prompts_in_flight, cfg.rollout.num_actors = args.in_flight, 1
    cfg.buffer.max_staleness = 1000  # never withhold credit: measure the actor, not admission
    cfg.buffer.capacity_groups = args.prompts * (args.reps + 2)
    cfg.learner.batch_prompts = cfg.buffer.capacity_groups
    tok = load_tokenizer(model_dir)
    items, _ = items_from_records(problem_records(sample_problems(args.prompts, split="train", seed=0), "train"),
                                  tok, cfg.data.max_prompt_tokens)
    emit({"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
          "model": model_dir if args.model else "tiny (tasks.build_tiny_model)", "prompts": len(items),
          "n": args.n, "max_tokens": args.max_tokens, "in_flight": args.in_flight})

    t0 = time.monotonic()
    host = EngineHost(EngineSpec.from_config(cfg, model_dir, 0, weight_transfer=False), name="bench")
    proc, address = start_buffer_process(cfg)
    actor = None
    try:
        host.start()
        emit({"phase": "engine_start", "seconds": round(time.monotonic() - t0, 2)})
        actor = RolloutActor(cfg, 0, model_dir, address, items, host=host)
        actor.start()
        t = time.monotonic()  # warm-up: every batch shape of both paths once
        host.call(bare(host.engine, items, args.n, args.max_tokens, args.in_flight, 1))
        actor.run(max_groups=len(items))
        emit({"phase": "warmup", "seconds": round(time.monotonic() - t, 2)})

        results = {"bare": [], "actor": [], "bare_all_at_once": []}
        s0, actor_wall = actor.stats(), 0.0
        for rep in range(args.reps):
            pair = ("bare", "actor") if rep % 2 == 0 else ("actor", "bare")  # ABBA: drift hits both
            for phase in (*pair, "bare_all_at_once"):
                t = time.monotonic()
                if phase == "actor":
                    before = actor.stats()["generated_tokens"]
                    assert actor.run(max_groups=len(items)) == len(items)
                    st = actor.stats()
                    tokens = st["generated_tokens"] - before
                else:
                    tokens = host.call(bare(host.engine, items, args.n, args.max_tokens,
                                            args.in_flight if phase == "bare" else None, 100 + rep))
                dt = time.monotonic() - t
                actor_wall += dt if phase == "actor" else 0.0
                results[phase].append(tokens / dt)
                emit({"phase": phase, "rep": rep, "tokens": tokens, "seconds": round(dt, 3),
                      "tokens_per_s": round(tokens / dt, 1)})
        st = actor.stats()
        ratios = [a / b for a, b in zip(results["actor"], results["bare"])]
        emit({"summary": True, "bare_tokens_per_s": round(statistics.median(results["bare"]), 1),
              "actor_tokens_per_s": round(statistics.median(results["actor"]), 1),
              "bare_all_at_once_tokens_per_s": round(statistics.median(results["bare_all_at_once"]), 1),
              "ratios": [round(r, 3) for r in ratios], "ratio_median": round(statistics.median(ratios), 3),
              "ratio_vs_all_at_once": round(statistics.median(results["actor"])
                                            / statistics.median(results["bare_all_at_once"]), 3),
              "goal": 0.9,
              # actor-side work after generation, summed over the measured actor phases (seconds and
              # share of their wall time): building rows (log mu, versions), decode + reward (thread),
              # push round trips (link thread, includes the buffer's validation and reply)
              **{f"actor_{k}": round(st[k] - s0[k], 3) for k in ("rows_s", "reward_s", "push_s")},
              **{f"actor_{k}_share": round((st[k] - s0[k]) / actor_wall, 4) for k in ("rows_s", "reward_s", "push_s")},
              "actor_groups_acked": st["groups_acked"], "actor_rejected": st["rejected"],
              "credit_denied": st["credit_denied"]})
    finally:
        if actor is not None:
            actor.close()
        host.close()
        proc.terminate()
        proc.join(10)
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
