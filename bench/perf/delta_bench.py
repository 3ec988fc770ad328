"""Delta weight sync: how much of a bf16 push changes between learner steps, on a real training loop.

A Qwen2-architecture model (random init, HF's initializer_range 0.02; small by default so it runs on a
CPU in a minute) is trained with AdamW on random-token causal-LM batches; after every optimiser step
its fp32 master weights are cast to bf16 (the serving dtype) and encoded by the sender's own
`weightsync.delta.DeltaEncoder` in delta mode. Reported per learning rate, after `--warmup` steps
(Adam's first steps move every weight by about lr; later, noisy gradients move most weights by less):
  changed_frac    changed bf16 elements / all elements
  gloo/full       bytes of the delta's gloo patch buckets (weightsync.packing) / bytes of a dense push
  nccl/full       bytes on vLLM's sparse NCCL path (int32 index + bf16 value per element) / dense bytes
Run: ``.venv/bin/python bench/perf/delta_bench.py [--lrs 1e-6 1e-5] [--steps 10] [--layers 4 --hidden 512]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from weightsync.delta import DeltaEncoder  # noqa: E402
from weightsync.packing import pack_patch_buckets  # noqa: E402


def make_model(layers: int, hidden: int, vocab: int, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
                      max_position_embeddings=1024, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def measure(lr: float, args) -> dict:
    model = make_model(args.layers, args.hidden, args.vocab, args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    enc = DeltaEncoder("delta", full_every=10**9)  # the first push is dense, every later one a delta
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for step in range(args.steps + 1):
        named = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
        payload = enc.encode(named, version=step, seq=step + 1)
        if payload.patches is not None:
            dense = sum(t.numel() * t.element_size() for _, t in named)
            gloo = sum(b.header.nbytes for b in pack_patch_buckets(payload.patches, 256 << 20))
            nccl = sum(p.indices.numel() * 4 + p.values.numel() * p.values.element_size() for p in payload.patches)
            rows.append({"step": step, "changed_frac": payload.changed_frac, "gloo/full": gloo / dense,
                         "nccl/full": nccl / dense})
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = rows[args.warmup:]
    params = sum(p.numel() for p in model.parameters())
    return {"lr": lr, "params": params, "steps": len(after),
            **{k: statistics.median(r[k] for r in after) for k in ("changed_frac", "gloo/full", "nccl/full")},
            "first_delta_changed_frac": rows[0]["changed_frac"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="delta pushes left out of the medians")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("# bench/perf/delta_bench.py: real AdamW steps on a random-init Qwen2-architecture model; bf16 pushes",
          flush=True)
    for lr in args.lrs:
        print(json.dumps(measure(lr, args)), flush=True)


if __name__ == "__main__":
    main()
