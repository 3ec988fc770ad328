"""Packed vs padded micro-batches: learner tokens/s on a batch of mixed lengths, measured within one run.

Two learners (`learner.packing` true and false, everything else equal: same row cap, same plan of rows)
train on the same random-initialised Llama-shaped model (default hidden 256, 4 layers, 4 heads of 64,
MLP 768, float32) and the same groups: response lengths drawn uniformly from [resp-min, resp-max],
prompts of prompt-len tokens. One learner step of GRPO at one mini-batch is forward + backward of every
micro-batch (π_prox comes from that forward) and one AdamW step. The two learners alternate step by
step (which goes first alternates too; this machine's load drifts) and the summary reports the median
of the per-pair ratios packed/padded of tokens per second (goal ≥ 1.3). On CPU the seconds are this
process's CPU time (run it with --threads 1): on a shared machine, wall time also counts the other
jobs' share of the cores; the wall-time ratio is reported beside it. On CUDA: wall time, synchronised.
Output: one JSON line per measured step and side, then a summary line.

  python bench/perf/packing.py --threads 1        # CPU: 64 rows of 17..513 tokens, 16-row micro-batches
  python bench/perf/packing.py --algo pacs        # whole groups per micro-batch (rows of a group cannot be sorted apart)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.perf.learner_bench import make_groups  # noqa: E402
from configs.schema import RunConfig  # noqa: E402
from learner.learner import Learner  # noqa: E402
from tasks.tiny_model import build_tiny_model  # noqa: E402


def measure(fn, device: torch.device) -> tuple[float, float]:
    """(seconds, wall seconds) of fn(): seconds are process CPU time on CPU, synchronised wall time on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - wall
    return (time.process_time() - cpu if device.type == "cpu" else wall), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--algo", default="grpo", choices=["grpo", "pacs"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--resp-min", type=int, default=1)
    ap.add_argument("--resp-max", type=int, default=497)
    ap.add_argument("--micro-batch", type=int, default=16, help="learner.micro_batch_samples (rows) of both sides")
    ap.add_argument("--micro-batch-tokens", type=int, default=None, help="learner.micro_batch_tokens of both sides")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / f"packing_bench_{args.hidden}x{args.layers}",
                                 hidden_size=args.hidden, num_heads=args.hidden // 64, num_layers=args.layers,
                                 intermediate_size=3 * args.hidden,
                                 max_position_embeddings=args.prompt_len + args.resp_max)
    learners = {}
    for side in ("packed", "padded"):
        cfg = RunConfig.model_validate({
            "algo": args.algo, "model": {"path": str(model_dir), "dtype": args.dtype},
            "rollout": {"n": args.n, "max_response_tokens": args.resp_max},
            "learner": {"micro_batch_samples": args.micro_batch, "micro_batch_tokens": args.micro_batch_tokens,
                        "packing": side == "packed", "lr": 1e-5, "batch_prompts": args.groups}})
        learners[side] = Learner(cfg, 0, 1, model_dir, device=device)
    groups = make_groups(len(learners["packed"].tokenizer), args.groups, args.n, args.prompt_len, args.resp_min,
                         args.resp_max, seed=0)
    tokens = sum(len(g.prompt_tokens) + len(s.tokens) for g in groups for s in g.samples)
    rates: dict[str, list[float]] = {"packed": [], "padded": [], "ratio": [], "wall_ratio": []}
    for step in range(args.warmup + args.steps):
        pair = {}
        for side in ("packed", "padded") if step % 2 == 0 else ("padded", "packed"):
            pair[side] = measure(lambda s=side, v=step: learners[s].step(groups, version=v), device)
            if step >= args.warmup:
                print(json.dumps({"side": side, "step": step - args.warmup, "time_s": pair[side][0],
                                  "wall_s": pair[side][1], "tokens_per_s": tokens / pair[side][0]}), flush=True)
        if step >= args.warmup:
            for side in ("packed", "padded"):
                rates[side].append(tokens / pair[side][0])
            rates["ratio"].append(pair["padded"][0] / pair["packed"][0])
            rates["wall_ratio"].append(pair["padded"][1] / pair["packed"][1])
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(json.dumps({
        "summary": True, "device": str(device), "dtype": args.dtype, "algo": args.algo,
        "model": f"hidden {args.hidden}, {args.layers} layers",
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "rows": args.groups * args.n, "tokens_per_step": tokens, "steps": args.steps,
        "packed_tokens_per_s": med["packed"], "padded_tokens_per_s": med["padded"],
        "ratio_median_of_pairs": med["ratio"], "wall_ratio_median_of_pairs": med["wall_ratio"],
        "clock": "process CPU time" if device.type == "cpu" else "wall"}), flush=True)


if __name__ == "__main__":
    main()
