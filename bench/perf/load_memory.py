"""Peak host RAM per learner rank while loading the policy: the old path vs the meta-device path.

A Qwen2-0.5B-shaped random-init model (transformers, from a config; saved in bf16 as the released
checkpoint is) is loaded as the trainable policy (fp32 master weights, FSDP2 over `--world` gloo/CPU
ranks) by each path, in fresh processes:
  old  `from_pretrained` (the whole model in fp32 on every rank), then `fully_shard` per decoder block
       and the root (the learner before meta-device loading);
  new  `learner.fsdp.build_scorer`: built on the meta device, sharded, each rank materialises and reads
       only its own rows of every tensor.
Each rank reports VmHWM (peak resident set, /proc/self/status) minus its baseline (VmRSS after imports
and process-group start, when the peak is reset through /proc/self/clear_refs). Goal: peak − baseline
≤ its share (fp32 model bytes / world) + a fixed overhead; the table states the excess over the share.

  python bench/perf/load_memory.py                  # 2 ranks, 0.5B-shaped
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GiB = 1024 ** 3
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1000000.0, tie_word_embeddings=True)


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def build_model(out: Path) -> int:
    """Save the random-init 0.5B-shaped Qwen2 to `out` (bf16); returns its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B)).to(torch.bfloat16)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def load_rank(rank: int, world: int, path: str, model_dir: str) -> dict:
    """One rank's peak − baseline RSS (bytes) while loading the policy by `path`."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from learner.distributed import init_distributed
    from learner.fsdp import build_scorer, decoder_layers, load_causal_lm, make_mesh
    from learner.logprobs import TokenScorer

    cpu = torch.device("cpu")
    init_distributed(rank, world, cpu)
    mesh = make_mesh(cpu, world)
    with contextlib.suppress(OSError):  # else the baseline is the peak so far (imports), not the RSS
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = status_kib("VmHWM")
    if path == "old":
        scorer = TokenScorer(load_causal_lm(model_dir, torch.float32))
        for layer in decoder_layers(scorer.lm):
            fully_shard(layer, mesh=mesh)
        fully_shard(scorer, mesh=mesh)
    else:
        scorer = build_scorer(model_dir, mesh=mesh, device=cpu, dtype="float32", trainable=True, chunk_tokens=4096)
    local = sum(p.to_local().numel() * p.element_size() for p in scorer.parameters())
    return {"rank": rank, "peak": (status_kib("VmHWM") - base) * 1024, "after": (status_kib("VmRSS") - base) * 1024,
            "local": local}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default=None, help="an HF model dir to load instead of the 0.5B-shaped one")
    args = ap.parse_args()
    from tests.learner.local_ranks import spawn_ranks

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(Path(tmp) / "qwen2_05b_shape")
        if args.model is None:
            n = build_model(Path(model_dir))
            print(f"built a Qwen2-0.5B-shaped model: {n / 1e6:.0f}M parameters", flush=True)
        rows = {p: spawn_ranks(load_rank, args.world, p, model_dir, timeout_s=1800) for p in ("old", "new")}
    model = sum(r["local"] for r in rows["new"])
    share = model / args.world
    print(f"\nfp32 model {model / GiB:.2f} GiB, share per rank (model / {args.world}) {share / GiB:.2f} GiB\n")
    print("| path | rank | peak − baseline | RSS after − baseline | excess over the share |")
    print("|---|---|---|---|---|")
    for p, ranks in rows.items():
        for r in ranks:
            print(f"| {p} | {r['rank']} | {r['peak'] / GiB:.2f} GiB | {r['after'] / GiB:.2f} GiB "
                  f"| {(r['peak'] - share) / GiB:+.2f} GiB |")


if __name__ == "__main__":
    main()
