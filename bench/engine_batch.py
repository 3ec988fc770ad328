"""One CPU vLLM engine's CPU time per sample by batch size and by seeding, the variants interleaved in one process.

What it answers: does one engine batching 2x the prompts spend less CPU a sample than two engines with half
each (the per-decode-step cost of a small model on CPU is mostly fixed: scheduling, op dispatch), and what
does `rollout.seeded` cost (vLLM samples seeded sequences one by one at every decode step)?

How: one in-process `vllm.LLM` (the actor's engine settings: float32, eager, processed log-probs, no chunked
prefill, one torch thread) on the quick-start's cached warm model (or `--model`) and its training prompts.
Each round generates one batch of every variant in turn (prompts per batch x seeded or not; `--n` samples
a prompt, the actor's sampling parameters); the figure per variant is the median over rounds of process
CPU seconds per 64 samples. Interleaving in one process keeps the machine's drifting speed out of the
ratios; absolute seconds are only as good as the machine's state.

    .venv/bin/python bench/engine_batch.py [--rounds 12 --prompts 4 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its CPU is this process's


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF model dir (default: the quick-start's SFT-warmed tiny model, built if missing)")
    ap.add_argument("--prompts", type=int, nargs="+", default=[4, 8], help="prompts per batch, one variant each")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from vllm import LLM, SamplingParams

    from actors.engine import EngineSpec
    from actors.prompts import items_from_records, load_tokenizer
    from configs.loading import resolve
    from launch.prep.model_prep import prepare_model
    from tasks import problem_records, sample_problems

    cfg = resolve("grpo")
    model_dir = args.model or str(prepare_model(cfg))
    tok = load_tokenizer(model_dir)
    need = (args.rounds + 1) * sum(args.prompts) * 2
    items, _ = items_from_records(problem_records(sample_problems(need, split="train", seed=0), "train"), tok,
                                  cfg.data.max_prompt_tokens)
    spec = EngineSpec.from_config(cfg, model_dir, weight_transfer=False, cpu=True)
    llm = LLM(**spec.engine_args_kwargs())
    rng, pos = random.Random(0), itertools.count()

    def batch(prompts: int, seeded: bool) -> float:
        its = [items[next(pos) % len(items)] for _ in range(prompts)]
        params = [SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, logprobs=0,
                                 flat_logprobs=True, seed=rng.randrange(2**31) if seeded else None,
                                 detokenize=False) for _ in its]
        cpu = time.process_time()
        llm.generate([{"prompt_token_ids": list(i.prompt_ids)} for i in its], params, use_tqdm=False)
        return (time.process_time() - cpu) * 64 / (prompts * args.n)

    variants = [(p, s) for p in args.prompts for s in (True, False)]
    for v in variants:  # warm-up
        batch(*v)
    times: dict = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            times[v].append(batch(*v))
    med = {v: statistics.median(x) for v, x in times.items()}
    for (prompts, seeded), cpu in med.items():
        print(json.dumps({"prompts_per_batch": prompts, "seeded": seeded, "sequences": prompts * args.n,
                          "cpu_s_per_64_samples": round(cpu, 3),
                          "seeded_over_unseeded": round(cpu / med[(prompts, False)], 3) if seeded else None,
                          "over_smallest_batch": round(cpu / med[(min(args.prompts), seeded)], 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
