"""Learner throughput vs a plain single-process torch loop doing the same work on the same data.

Both sides, per optimiser step, on identical synthetic groups (prompt + response token ids):
  1. a no-grad forward over every micro-batch (π_prox),
  2. forward + backward of a policy-gradient loss over the same micro-batches (same row order,
     same padding: each micro-batch padded to its own longest sequence),
  3. grad-norm clipping and one AdamW step.
The learner does it through its real path (chunked log-probs, GRPO from the registry, global
normalisation, metrics; at world size 1 the plain module by default, FSDP2 with `--fsdp on`); the plain loop is an unsharded HF model, full logits,
log_softmax + gather, a token-mean −A·ratio loss. The two sides alternate step by step (the load
on a shared machine drifts; adjacent steps see similar conditions) and the summary reports the
median of the per-pair ratios learner/plain of tokens per second (goal ≥ 0.9). Output: one JSON
line per measured step and side, then a summary line.

  python bench/perf/learner_bench.py                         # CPU, float32, the tiny model
  python bench/perf/learner_bench.py --device cuda --dtype bfloat16 --model /path/to/hf_model
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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from buffer.records import Group, Sample  # noqa: E402
from configs.schema import RunConfig  # noqa: E402
from learner import batching  # noqa: E402
from learner.learner import Learner  # noqa: E402


def make_groups(vocab: int, n_groups: int, n: int, prompt_len: int, resp_min: int, resp_max: int,
                seed: int) -> list[Group]:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        prompt = rng.integers(7, vocab, prompt_len, dtype=np.int32)
        samples = []
        for _ in range(n):
            t = int(rng.integers(resp_min, resp_max + 1))
            samples.append(Sample(tokens=rng.integers(7, vocab, t, dtype=np.int32),
                                  logprobs=(-rng.uniform(0.5, 4.0, t)).astype(np.float32),
                                  versions=np.zeros(t, dtype=np.int32), prefix_mask=np.zeros(t, dtype=bool),
                                  reward=float(rng.integers(0, 2))))
        groups.append(Group(group_id=f"g{g}", prompt_index=g, prompt_tokens=prompt, samples=samples))
    return groups


class PlainLoop:
    """The reference: an unsharded HF model, full logits, the same micro-batches, AdamW."""

    def __init__(self, model_dir: Path, groups: list[Group], cfg: RunConfig, device: torch.device):
        from transformers import AutoModelForCausalLM

        self.dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        self.device, self.temperature = device, cfg.rollout.temperature
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
        lc = cfg.learner
        self.grad_clip = lc.grad_clip
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lc.lr, betas=lc.betas,
                                     weight_decay=lc.weight_decay, eps=1e-8)
        rows = batching.rows_from_groups(groups)
        plan = batching.plan_microbatches(rows, list(range(len(rows))), lc.micro_batch_samples)
        self.mbs = [batching.make_microbatch(rows, idx, 0, device) for idx in plan]
        self.adv = torch.tensor([r.reward - 0.5 for r in rows], device=device)
        self.n_tok = sum(len(r.response) for r in rows)

    def logp(self, mb: batching.MicroBatch) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            logits = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        flat = logits.reshape(-1, logits.shape[-1]).index_select(0, mb.positions).float()
        return torch.log_softmax(flat / self.temperature, -1).gather(-1, mb.targets[:, None]).squeeze(-1)

    def step(self) -> None:
        with torch.no_grad():
            old = [self.logp(mb) for mb in self.mbs]
        for mb, o in zip(self.mbs, old):
            lp = self.logp(mb)
            a = self.adv[torch.tensor(mb.rows, device=self.device)][mb.row_of]
            loss = (-(a * torch.exp(lp - o))).sum() / self.n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--model", default=None, help="HF model dir (default: build the tiny model)")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--resp-min", type=int, default=64)
    ap.add_argument("--resp-max", type=int, default=192)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--fsdp", default="auto", choices=["auto", "on"],
                    help="auto: the learner's default (plain module at world size 1); on: FSDP2 even at one rank")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model_dir = args.model
    if model_dir is None:
        from tasks.tiny_model import build_tiny_model

        model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "learner_bench_tiny")
    cfg = RunConfig.model_validate({
        "algo": "grpo", "model": {"dtype": args.dtype},
        "rollout": {"n": args.n, "max_response_tokens": args.resp_max},
        # packing off: the plain loop pads, and this compares the two paths on the same work
        # (packed vs padded is bench/perf/packing.py)
        "learner": {"micro_batch_samples": args.micro_batch, "lr": 1e-5, "batch_prompts": args.groups,
                    "packing": False}})
    learner = Learner(cfg, 0, 1, model_dir, device=device, fsdp=True if args.fsdp == "on" else None)
    groups = make_groups(len(learner.tokenizer), args.groups, args.n, args.prompt_len, args.resp_min,
                         args.resp_max, seed=0)
    plain = PlainLoop(Path(model_dir), groups, cfg, device)
    tokens = sum(len(g.prompt_tokens) + len(s.tokens) for g in groups for s in g.samples)
    results: dict[str, list[float]] = {"learner": [], "plain": [], "ratio": []}
    version = 0
    for step in range(args.warmup + args.steps):
        # Alternate the two sides step by step (this machine's load drifts) and pair adjacent steps;
        # which side goes first alternates too.
        pair = {}
        for side in (("learner", "plain") if step % 2 == 0 else ("plain", "learner")):
            if side == "learner":
                dt = timed(lambda v=version: learner.step(groups, version=v), device)
                version += 1
            else:
                dt = timed(plain.step, device)
            pair[side] = tokens / dt
            if step >= args.warmup:
                print(json.dumps({"side": side, "step": step - args.warmup, "time_s": dt,
                                  "tokens_per_s": tokens / dt}), flush=True)
        if step >= args.warmup:
            results["learner"].append(pair["learner"])
            results["plain"].append(pair["plain"])
            results["ratio"].append(pair["learner"] / pair["plain"])
    med = {k: statistics.median(v) for k, v in results.items()}
    print(json.dumps({
        "summary": True, "device": str(device), "dtype": args.dtype, "model": str(model_dir),
        "fsdp": learner.fsdp,
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "rows": args.groups * args.n, "tokens_per_step": tokens,
        "steps": args.steps, "learner_tokens_per_s": med["learner"], "plain_tokens_per_s": med["plain"],
        "ratio_median_of_pairs": med["ratio"], "ratio_of_medians": med["learner"] / med["plain"]}), flush=True)


if __name__ == "__main__":
    main()
