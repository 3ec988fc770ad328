"""Step memory_7b of bench/gpu/gpu_smoke.py (reviews/gpu_path_2.md §3 step 5): the learner's activation memory per
token at Qwen2.5-7B's width and vocabulary, measured on the GPU, against the arithmetic the run's start line
and `algo-train doctor` count with (`launch/planning/memory_estimate.py`).

How: `launch.doctor.probes.learner_memory`, the doctor's own probe (a forward + backward of the log-prob
path through the model cut to 1 and 2 decoder layers, bf16, `--tokens` packed tokens, LM head in chunks of
`--chunk`), on a model built from the config (transformers' `AutoConfig.for_model`: nothing downloaded).
Printed beside it: the estimate's bytes per layer per token without activation checkpointing,
(4h + 2 × MLP width) × 2 B (104 448 B at 7B), and its log-prob head, 4 buffers × chunk × vocabulary × 4 B
(2.49 GB at chunk 1024), when the estimate's module can be imported (it needs pydantic).
`--shape tiny --device cpu` runs the code path on a CPU.

    python bench/gpu/gpu_smoke_memory.py [--tokens 1024 --chunk 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.gpu_smoke import MODEL_CONFIGS  # noqa: E402
from launch.doctor.probes import learner_memory  # noqa: E402


def estimate(config: dict, tokens: int, chunk: int) -> dict | None:
    """The estimate's per-layer-per-token activation bytes (checkpointing off) and log-prob head bytes, or
    None when `launch.planning.memory_estimate` cannot be imported here."""
    try:
        from launch.planning.memory_estimate import learner_memory as budget
        from launch.planning.model_shape import ModelShape
    except ImportError:
        return None
    shape = ModelShape.from_config(config)
    parts = dict(budget(shape, world=1, tokens=1, chunk_tokens=chunk, checkpointing=False).every_rank)
    # with checkpointing off, one token keeps every layer's activations plus the running layer's: layers + 1
    return {"layer_token_bytes": parts["activations"] / (shape.layers + 1), "head_bytes": parts["log-prob head"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="7b", choices=sorted(MODEL_CONFIGS))
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=1024, help="learner.logprob_chunk_tokens (its GPU default: 1024)")
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_smoke_memory: no CUDA device (use --device cpu --shape tiny to run the code path only)",
              file=sys.stderr)
        return 2
    config = MODEL_CONFIGS[args.shape]
    m = learner_memory(config, args.tokens, "bfloat16", args.chunk, args.device)
    est = estimate(config, args.tokens, args.chunk)
    out = {"shape": args.shape, "tokens": args.tokens, "chunk": args.chunk, "measured": m, "estimate": est}
    layer = m["per_layer_token_bytes"]
    peak = m["peak_2_layers_bytes"]
    out["summary"] = (f"{args.shape} width, {args.tokens} tokens, chunk {args.chunk}: {layer:,.0f} B saved per layer "
                      f"per token (estimate {est['layer_token_bytes']:,.0f} B), head and embedding "
                      f"{m['head_token_bytes']:,.0f} B per token (the estimate counts the log-prob head's "
                      f"transient buffers instead: {est['head_bytes'] / 1e9:.2f} GB)" if est else
                      f"{args.shape} width: {layer:,.0f} B saved per layer per token, head and embedding "
                      f"{m['head_token_bytes']:,.0f} B per token (estimate not importable: pydantic?)")
    out["summary"] += f"; 2-layer peak {peak / 1e9:.2f} GB" if peak else ""
    print("SMOKE " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
