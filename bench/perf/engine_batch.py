"""One CPU vLLM engine's CPU time per sample by batch size, seeding and prefix caching, the variants interleaved
in one process.

What it answers: does one engine batching 2x the prompts spend less CPU a sample than two engines with half
each (the per-decode-step cost of a small model on CPU is mostly fixed: scheduling, op dispatch), what
does `rollout.seeded` cost (vLLM samples seeded sequences one by one at every decode step), and what do
prefix caching and the cache salt of `weight_sync.clear_cache=false` cost or save (`--caching`)?

How: one in-process `vllm.LLM` (the actor's engine settings: float32, eager, processed log-probs, no chunked
prefill, one torch thread) on the quick-start's cached warm model (or `--model`) and its training prompts.
Each round generates one batch of every variant in turn (prompts per batch x seeded or not; `--n` samples
a prompt, the actor's sampling parameters); the figure per variant is the median over rounds of process
CPU seconds per 64 samples. Interleaving in one process keeps the machine's drifting speed out of the
ratios; absolute seconds are only as good as the machine's state.

Prefix caching (`--caching`, one variant each): "default" is the actor's engine when pushes clear the cache
(vLLM's default: caching on, requests unsalted); "salted" the same engine with every request salted by the
round's weight version (`actors.generate.request_prompt`: what `weight_sync.clear_cache=false` does, one push
per round), "off" an engine with prefix caching off (what `clear_cache=false` meant before the salt). Both
engines live in this process. A group's n samples can share only the prompt's full KV blocks (vLLM's CPU
block is 128 tokens; the quick-start's prompts are 15-19), so `--prefix-tokens` also runs longer prompts:
each prompt after that many tokens of other prompts, drawn per prompt (nothing is shared across groups).
Each variant also reports the prompt share vLLM served from the cache (`num_cached_tokens` of the group's
output, which vLLM takes from one of its n requests).

    .venv/bin/python bench/perf/engine_batch.py [--rounds 12 --prompts 4 8]
    .venv/bin/python bench/perf/engine_batch.py --prompts 16 --seeded false --caching off salted --prefix-tokens 0 256
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its CPU is this process's

CACHING = {"default": None, "salted": None, "off": False}  # --caching arm -> the engine's enable_prefix_caching


def ratio(med: dict, variant: tuple, field: int, value) -> float | None:
    """The median of `variant` over that of the variant differing from it in `field` only, set to `value`
    (None when that is `variant` itself or was not run)."""
    other = variant[:field] + (value,) + variant[field + 1:]
    return round(med[variant] / med[other], 3) if other != variant and other in med else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF model dir (default: the quick-start's SFT-warmed tiny model, built if missing)")
    ap.add_argument("--prompts", type=int, nargs="+", default=[4, 8], help="prompts per batch, one variant each")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seeded", nargs="+", default=["true", "false"], choices=["true", "false"],
                    help="seeded requests or not, one variant each")
    ap.add_argument("--caching", nargs="+", default=["default"], choices=sorted(CACHING),
                    help="prefix caching, one variant each (module docstring)")
    ap.add_argument("--prefix-tokens", type=int, nargs="+", default=[0],
                    help="tokens of other prompts before each prompt, one variant each (module docstring)")
    ap.add_argument("--model-len", type=int, default=None, help="engine context (default: the run's, or "
                    "enough for the longest prefix + prompt + response)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from vllm import LLM, SamplingParams

    from actors.engine import EngineSpec
    from actors.generate import request_prompt
    from actors.prompts import items_from_records, load_tokenizer
    from configs.loading import resolve
    from launch.prep.model_prep import prepare_model
    from tasks import problem_records, sample_problems

    cfg = resolve("grpo")
    model_dir = args.model or str(prepare_model(cfg))
    tok = load_tokenizer(model_dir)
    seeded_arms = [v == "true" for v in args.seeded]
    per_round = sum(args.prompts) * len(seeded_arms) * len(args.caching) * len(args.prefix_tokens)
    items, _ = items_from_records(problem_records(sample_problems((args.rounds + 1) * per_round + 64, split="train",
                                                                  seed=0), "train"), tok, cfg.data.max_prompt_tokens)
    longest = max(len(i.prompt_ids) for i in items) + max(args.prefix_tokens) + args.max_tokens
    engines = {}  # one per enable_prefix_caching value the --caching arms need
    for arm in args.caching:
        key = CACHING[arm]
        if key not in engines:
            spec = EngineSpec.from_config(cfg, model_dir, weight_transfer=False, cpu=True, enable_prefix_caching=key)
            spec.max_model_len = args.model_len or max(spec.max_model_len, longest)
            engines[key] = LLM(**spec.engine_args_kwargs())
    rng, pos = random.Random(0), itertools.count()

    def prompt_ids(prefix_tokens: int) -> list[int]:
        ids = list(items[next(pos) % len(items)].prompt_ids)
        filler: list[int] = []
        while len(filler) < prefix_tokens:
            filler += items[rng.randrange(len(items))].prompt_ids
        return filler[:prefix_tokens] + ids

    def batch(prompts: int, seeded: bool, caching: str, prefix_tokens: int, version: int) -> tuple[float, float]:
        ids = [prompt_ids(prefix_tokens) for _ in range(prompts)]
        params = [SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, logprobs=0,
                                 flat_logprobs=True, seed=rng.randrange(2**31) if seeded else None,
                                 detokenize=False) for _ in ids]
        reqs = [request_prompt(i, version if caching == "salted" else None) for i in ids]
        cpu = time.process_time()
        outs = engines[CACHING[caching]].generate(reqs, params, use_tqdm=False)
        cpu = (time.process_time() - cpu) * 64 / (prompts * args.n)
        cached = sum(o.num_cached_tokens or 0 for o in outs) / sum(len(i) for i in ids)
        return cpu, cached

    variants = [(p, s, c, t) for t in args.prefix_tokens for p in args.prompts for s in seeded_arms
                for c in args.caching]
    for v in variants:  # warm-up
        batch(*v, version=0)
    times: dict = {v: [] for v in variants}
    cached: dict = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:  # one weight version a round: salted requests never share across rounds
            cpu, hit = batch(*v, version=r + 1)
            times[v].append(cpu)
            cached[v].append(hit)
    med = {v: statistics.median(x) for v, x in times.items()}
    for (prompts, seeded, caching, prefix), cpu in med.items():
        v = (prompts, seeded, caching, prefix)
        print(json.dumps({"prompts_per_batch": prompts, "seeded": seeded, "caching": caching,
                          "prefix_tokens": prefix, "sequences": prompts * args.n,
                          "cpu_s_per_64_samples": round(cpu, 3),
                          "prompt_share_cached": round(statistics.fmean(cached[v]), 3),
                          "seeded_over_unseeded": ratio(med, v, 1, False),
                          "over_caching_off": ratio(med, v, 2, "off"),
                          "over_smallest_batch": ratio(med, v, 0, min(args.prompts))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
