"""Push bytes and seconds of a LoRA run's weights: the merged model (what a LoRA run pushes today, = a full
run's push) against its adapter alone (what an adapter-only push would move), through the real weight sync
(WeightSender, gloo plane) to 2 plain receivers (weightsync.gloo.plain_receiver: same rendezvous, framing,
unpacking and acknowledgements as the vLLM path, a dict where vLLM would load), alternating the two kinds of
push so both see the same load. Ratios within one run are the result (bench/lora_quickstart.md).

Cases: the quick-start's tiny Llama (fp32) with a rank-16 adapter on its 7 projections, and a Qwen2-0.5B-shaped
model (bf16) with the same adapter layout. Run:
``.venv/bin/python bench/perf/lora_push.py [--cases tiny qwen05b] [--pushes 5]``; one JSON line per case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TOKEN = "bench-lora-push-token"  # the weight-sync admission token (a run generates its own)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_of(case: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if case == "tiny":  # tasks.tiny_model's shape (vocabulary of its character tokenizer: 103)
        cfg = LlamaConfig(vocab_size=103, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
        return LlamaForCausalLM(cfg).to(torch.float32)
    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=512, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16)


def adapter_of(model, rank: int) -> list[tuple[str, object]]:
    """(peft name, tensor) of a rank-`rank` adapter on every targeted linear layer, in the model's dtype."""
    import torch

    out = []
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS and isinstance(m, torch.nn.Linear):
            dt = m.weight.dtype
            out.append((f"base_model.model.{name}.lora_A.weight", torch.randn(rank, m.in_features, dtype=dt)))
            out.append((f"base_model.model.{name}.lora_B.weight", torch.randn(m.out_features, rank, dtype=dt)))
    return out


def start_plain(address: tuple[str, int], n: int = 2) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        p = subprocess.Popen([sys.executable, "-m", "weightsync.gloo.plain_receiver", "--host", address[0], "--port",
                              str(address[1]), "--name", f"plain-{i}", "--pushes", "1000000"], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        p.stdin.write(f"{TOKEN}\n".encode())  # the plain receiver reads the token from its first stdin line
        p.stdin.flush()
        procs.append(p)
    return procs


def run_case(case: str, pushes: int, rank: int) -> dict:
    import torch

    from weightsync import WeightSender

    model = model_of(case)
    full = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    adapter = adapter_of(model, rank)
    sender = WeightSender(2, token=TOKEN, timeout_s=300, connect_timeout_s=600)
    procs = start_plain(sender.address)
    times: dict[str, list[float]] = {"full": [], "adapter": []}
    sent: dict[str, int] = {}
    try:
        sender.connect()
        version = 0
        for i in range(pushes + 1):
            for kind, tensors in (("full", full), ("adapter", adapter)):
                version += 1
                with torch.no_grad():
                    tensors[0][1].add_(1e-3)  # a real change every version
                stats = sender.push(list(tensors), version=version)
                sent[kind] = stats["bytes"]
                if i:  # the first round pays one-off costs (first-touch page faults)
                    times[kind].append(stats["seconds"])
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        sender.close()
    full_s, adapter_s = statistics.median(times["full"]), statistics.median(times["adapter"])
    return {"case": case, "dtype": str(full[0][1].dtype), "lora_rank": rank, "pushes": pushes,
            "params": sum(t.numel() for _, t in full), "adapter_params": sum(t.numel() for _, t in adapter),
            "full_bytes": sent["full"], "adapter_bytes": sent["adapter"],
            "bytes_ratio": sent["full"] / sent["adapter"], "full_sync_s_median": full_s,
            "adapter_sync_s_median": adapter_s, "seconds_ratio": full_s / adapter_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["tiny", "qwen05b"], choices=["tiny", "qwen05b"])
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    for case in args.cases:
        t0 = time.perf_counter()
        print(json.dumps(run_case(case, args.pushes, args.rank) | {"wall_s": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main()
