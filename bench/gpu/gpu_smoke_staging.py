"""Step staging_7b of bench/gpu/gpu_smoke.py (reviews/gpu_path_2.md, Appendix B; torch only): pushes of a
Qwen2.5-7B-shaped model (15.2 GB in bf16) staged to host memory by `WeightSender.prepare`, as learner rank 0
stages every push.

What it shows: how long allocating and registering the host buffers takes (`reserve_staging`, what learner
rank 0 does when its weight-sync group forms, from the model's shapes), then per push how long `prepare` and
the staging copies take (every push, the first included, only copies into those buffers), the host
bytes registered against `weightsync.staging.pinned_staging_bytes` (the figure the start line and the doctor
print), that torch's pinned-memory cache did not grow (it would round every block up to a power of two), and
that nothing of a push stays on the GPU once it is staged (C2). Pushes: 1 dense, then `--pushes` − 1 deltas
with every `--stride`-th element of every weight changed (as a learner step changes them), each released
after staging as a completed send releases it, so the next one reuses its memory.

The sender's data plane is gloo (the staging is the same for NCCL; gloo's plane needs no vLLM and opens
nothing until a push is sent, and none is). Needs ~2× the payload in host RAM in delta mode (30.5 GB for
7B, reserved before push 1 even with `--pushes 1`). `--shape tiny --device cpu` runs the code path on a CPU
(nothing is staged there).

    python bench/gpu/gpu_smoke_staging.py [--shape 7b --pushes 3 --stride 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.gpu_smoke import MODEL_CONFIGS  # noqa: E402
from weightsync.sender import WeightSender  # noqa: E402
from weightsync.staging import pinned_staging_bytes  # noqa: E402

GB = 1e9


def qwen2_tensors(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a Qwen2 checkpoint with config `c` (q/k/v biases and norms included: 339 tensors
    for Qwen2.5-7B)."""
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (i, h)),
                (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def staged(payload) -> list[torch.Tensor]:
    if payload.full is not None:
        return [t for _, t in payload.full]
    return [t for p in payload.patches for t in (p.indices, p.values)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="7b", choices=sorted(MODEL_CONFIGS))
    ap.add_argument("--pushes", type=int, default=3, help="the first dense, the others deltas")
    ap.add_argument("--stride", type=int, default=50, help="a delta changes every stride-th element (50: 2 %%)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_smoke_staging: no CUDA device (use --device cpu --shape tiny to run the code path only)",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    weights = {n: torch.empty(s, device=device, dtype=torch.bfloat16).normal_()
               for n, s in qwen2_tensors(MODEL_CONFIGS[args.shape])}  # the learner's gathered weights
    dense = sum(w.numel() * w.element_size() for w in weights.values())
    if cuda:
        torch.cuda.synchronize(device)
    gpu_base = torch.cuda.memory_allocated(device) if cuda else 0
    torch_pinned = (lambda: torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)) if cuda else (lambda: 0)
    pinned_before = torch_pinned()
    sender = WeightSender(1, token="smoke" * 13, mode="delta", full_every=10**6)
    pushes, problems = [], []
    try:
        t0 = time.perf_counter()
        sender.reserve_staging([(n, w.shape, w.dtype) for n, w in weights.items()], device)
        reserve_s = time.perf_counter() - t0
        for k in range(1, args.pushes + 1):
            if k > 1:  # a learner step: every stride-th element of every weight changes
                for w in weights.values():
                    w.view(-1)[::args.stride] += 1
            t0 = time.perf_counter()
            payload = sender.prepare(((n, w.clone()) for n, w in weights.items()), version=k)
            t1 = time.perf_counter()
            payload.wait_ready()
            t2 = time.perf_counter()
            tensors = staged(payload)
            sent = sum(t.numel() * t.element_size() for t in tensors)
            host = sender._staging.memory.allocated  # registered host bytes so far (this sender's staging)
            above = (torch.cuda.memory_allocated(device) - gpu_base) if cuda else 0
            pushes.append({"push": k, "mode": payload.mode, "changed_frac": round(payload.changed_frac, 4),
                           "prepare_s": round(t1 - t0, 2), "ready_s": round(t2 - t1, 2), "sent_gb": round(sent / GB, 3),
                           "host_registered_gb": round(host / GB, 3),
                           "torch_pinned_growth_gb": round((torch_pinned() - pinned_before) / GB, 3),
                           "gpu_above_weights_gb": round(above / GB, 3)})
            if cuda and not all(t.device.type == "cpu" and t.is_pinned() for t in tensors):
                problems.append(f"push {k}: a staged tensor is not in pinned host memory")
            if above > GB:
                problems.append(f"push {k}: {above / GB:.2f} GB of it stayed on the GPU (C2)")
            if k == 1 and cuda and not torch.equal(payload.full[1][1], weights[payload.full[1][0]].cpu()):
                problems.append("push 1: a staged tensor differs from its device copy")
            if k > 1 and payload.mode != "delta":
                problems.append(f"push {k}: sent {payload.mode}, a delta of 1/{args.stride} of the elements expected")
            sender._staging.release(payload.seq)  # what a completed send does: the next push reuses the memory
            del payload, tensors
    finally:
        sender.close()
    want = pinned_staging_bytes(dense, "delta", tensors=len(weights)) if cuda else 0
    last = pushes[-1]
    if cuda and abs(last["host_registered_gb"] * GB - want) > 0.001 * GB:
        problems.append(f"{last['host_registered_gb']:.3f} GB of host memory registered, "
                        f"pinned_staging_bytes says {want / GB:.3f} GB")
    if cuda and last["torch_pinned_growth_gb"] > 0.01:
        problems.append(f"torch's pinned-memory cache grew by {last['torch_pinned_growth_gb']:.2f} GB")
    out = {"device": str(device), "shape": args.shape, "tensors": len(weights), "dense_gb": round(dense / GB, 3),
           "pinned_staging_gb_expected": round(want / GB, 3), "reserve_s": round(reserve_s, 2), "pushes": pushes}
    first, later = pushes[0], pushes[1:]
    out["summary"] = (f"{len(weights)} tensors, {dense / GB:.2f} GB: reserve {reserve_s:.1f} s; "
                      f"push 1 (dense) prepare {first['prepare_s']:.1f} s "
                      f"+ {first['ready_s']:.1f} s"
                      + "".join(f"; push {p['push']} ({p['mode']}, {p['changed_frac']:.1%}) {p['prepare_s']:.1f} "
                                f"+ {p['ready_s']:.1f} s" for p in later)
                      + f"; host registered {last['host_registered_gb']:.2f} GB (expected {want / GB:.2f}), "
                      f"GPU above the weights {max(p['gpu_above_weights_gb'] for p in pushes):.2f} GB"
                      + (f" — FAILED: {'; '.join(problems)}" if problems else ""))
    print("SMOKE " + json.dumps(out), flush=True)
    if problems:
        print("gpu_smoke_staging: " + "; ".join(problems), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
