"""The learner on one GPU: tokens/s against a plain torch training loop, peak GPU memory, packed vs padded.

Models: random-init Qwen2-0.5B- and Qwen2-1.5B-shaped causal LMs (transformers, from a config, saved
in bf16 to a temporary directory; nothing is downloaded). One batch of mixed lengths (`--groups` ×
`--n` rows, prompt `--prompt-len` tokens, responses uniform in [`--resp-min`, `--resp-max`]) is
trained by every side, one side after another (each needs the GPU's memory to itself):
  learner packed     `Learner.step`, bf16 compute on fp32 masters, rows packed back to back
                     (`learner.packing`), activation checkpointing as `learner.activation_checkpointing`
                     auto resolves it on CUDA (on);
  learner padded     the same with every micro-batch padded to its longest row;
  learner packed, no checkpointing;
  plain loop         bench/perf/learner_bench.py's `PlainLoop`: the same HF model unsharded, AdamW, bf16
                     autocast, full logits, padded micro-batches, no checkpointing.
Each side takes a π_prox forward and a forward + backward per micro-batch then one AdamW step
(`bench/perf/learner_bench.py`). tokens/s = the batch's tokens / median step time over `--steps` steps
after `--warmup`; peak memory = `torch.cuda.max_memory_allocated` over the side's build and steps.
Needs torch, transformers and safetensors (no vLLM, no network). Prints a markdown table.

  python bench/gpu/gpu_learner.py                               # both shapes, on cuda
  python bench/gpu/gpu_learner.py --device cpu --shapes tiny --groups 2 --n 2 --resp-max 32   # smoke run
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.perf.learner_bench import PlainLoop, make_groups, timed  # noqa: E402
from configs.schema import RunConfig  # noqa: E402
from learner.learner import Learner  # noqa: E402

_QWEN2 = dict(vocab_size=151936, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
              tie_word_embeddings=True)
SHAPES = {  # the released Qwen2 configs' shapes
    "0.5b": _QWEN2 | dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5b": _QWEN2 | dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    "tiny": dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, tie_word_embeddings=True),  # smoke runs only
}
SIDES = (("learner packed", True, "auto"), ("learner padded", False, "auto"),
         ("learner packed, no checkpointing", True, False), ("plain loop", None, None))


def build_model(shape: str, out: Path) -> Path:
    """A random-init Qwen2 of `shape` and the tiny model's tokenizer (its pad id only) saved to `out`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tasks.tiny_model import build_tokenizer

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape])).to(torch.bfloat16).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return out


def make_side(cfg: RunConfig, plain: bool, model_dir: Path, groups, device: torch.device):
    """(build, step(side, k)) of the plain loop or of a learner under `cfg`."""
    if plain:
        return partial(PlainLoop, model_dir, groups, cfg, device), lambda side, k: side.step()
    return partial(Learner, cfg, 0, 1, model_dir, device=device), lambda side, k: side.step(groups, version=k)


def run_side(make, step, device: torch.device, steps: int, warmup: int) -> tuple[float, float | None]:
    """(median step time in s, peak GPU memory in GiB or None on CPU) of `step(side)` after `make()`."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    side = make()
    times = [timed(partial(step, side, k), device) for k in range(warmup + steps)][warmup:]
    peak = torch.cuda.max_memory_allocated(device) / 1024 ** 3 if device.type == "cuda" else None
    del side
    gc.collect()
    return statistics.median(times), peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", nargs="+", default=["0.5b", "1.5b"], choices=sorted(SHAPES))
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--resp-min", type=int, default=32)
    ap.add_argument("--resp-max", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/gpu/gpu_learner.py needs CUDA: no GPU is visible to torch (run it on a GPU machine; "
                 "`--device cpu --shapes tiny` is a smoke run of the code only)")
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    lines = ["| model | side | tokens/s | vs plain loop | peak GPU memory |", "|---|---|---|---|---|"]
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_model(shape, Path(tmp) / shape)
            groups = make_groups(SHAPES[shape]["vocab_size"], args.groups, args.n, args.prompt_len, args.resp_min,
                                 args.resp_max, seed=0)
            tokens = sum(len(g.prompt_tokens) + len(s.tokens) for g in groups for s in g.samples)

            def config(packing: bool | None, ac) -> RunConfig:
                learner = {"micro_batch_samples": args.micro_batch, "lr": 1e-5, "batch_prompts": args.groups}
                if packing is not None:
                    learner |= {"packing": packing, "activation_checkpointing": ac}
                return RunConfig.model_validate({"algo": "grpo", "model": {"dtype": dtype}, "learner": learner,
                                                 "rollout": {"n": args.n, "max_response_tokens": args.resp_max}})

            results = {}
            for name, packing, ac in SIDES:
                make, step = make_side(config(packing, ac), packing is None, model_dir, groups, device)
                results[name] = run_side(make, step, device, args.steps, args.warmup)
                print(f"{shape} {name}: {tokens / results[name][0]:.0f} tokens/s", file=sys.stderr, flush=True)
            plain = results["plain loop"][0]
            for name, (t, peak) in results.items():
                mem = f"{peak:.1f} GiB" if peak is not None else "n/a (CPU)"
                lines.append(f"| {shape} | {name} | {tokens / t:.0f} | {plain / t:.2f} | {mem} |")
            lines.append(f"| {shape} | packed / padded | {results['learner padded'][0] / results['learner packed'][0]:.2f}× "
                         "| | |")
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, {dtype}, "
          f"{args.groups}×{args.n} rows, prompt {args.prompt_len}, responses {args.resp_min}–{args.resp_max} tokens, "
          f"micro-batch {args.micro_batch} rows, median of {args.steps} steps after {args.warmup}\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
