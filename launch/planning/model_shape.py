"""What a model's `config.json` says about the memory and context a run needs, without loading the model.

- context: `max_position_embeddings`, the longest sequence the model was built for; an engine's
  `max_model_len` (= data.max_prompt_tokens + rollout.max_response_tokens) above it does not start.
- KV cache per token: 2 (K and V) × layers × KV heads × head_dim × bytes per element. Qwen2.5-7B:
  2 × 28 × 4 × 128 × 2 B = 57 344 B = 56 KiB, so 1 GiB holds 18 724 tokens.
- KV tokens of an engine: its KV budget / the bytes per token. The budget is `rollout.kv_cache_gib` on CPU
  engines (and on GPUs when set); on GPUs by default vLLM's `gpu_memory_utilization` share of the GPU
  minus the weights and vLLM's own overhead, which only the engine knows at start — it logs the figure.

Pure functions of the parsed JSON, so the preflight, `algo-train doctor` and tests share them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # MLP width
    tied: bool  # input and output embeddings share one matrix
    context: int | None  # max_position_embeddings; None when the config does not say

    @classmethod
    def from_config(cls, c: dict) -> ModelShape:
        c = c.get("text_config", c)  # multimodal configs nest the language model's
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        ctx = c.get("max_position_embeddings")
        return cls(layers=int(c["num_hidden_layers"]), hidden=hidden, heads=heads,
                   kv_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or hidden // heads), vocab=int(c["vocab_size"]),
                   intermediate=int(c.get("intermediate_size") or 4 * hidden),
                   tied=bool(c.get("tie_word_embeddings", False)), context=int(ctx) if ctx else None)

    @classmethod
    def read(cls, model_dir: str | Path) -> ModelShape:
        return cls.from_config(json.loads((Path(model_dir) / "config.json").read_text()))

    def parameters(self) -> int:
        """Parameters of a Llama/Qwen-style decoder (attention with grouped KV heads, gated MLP, RMS norms),
        without biases: embeddings (twice unless tied) + layers × (q, k, v, o + gate, up, down + 2 norms)
        + the final norm. Qwen2.5-7B (28 layers, hidden 3584, 28 heads of 128, 4 KV heads, MLP 18944,
        vocabulary 152 064, untied): 2 × 152064 × 3584 + 28 × 233 053 184 + 3584 = 7.615 B (published 7.62 B;
        its q/k/v biases, 0.2 M, are left out)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    def lora_parameters(self, rank: int, targets: list[str] | tuple[str, ...]) -> int:
        """Parameters of rank-`rank` LoRA adapters on the layers named `targets` (model.lora): rank × (in + out)
        per adapted linear layer and decoder block. The Llama/Qwen projections have their shapes (q: hidden →
        heads × head_dim, k and v: hidden → KV heads × head_dim, o back, gate/up: hidden → MLP width, down
        back); any other name is counted as a hidden → hidden layer. Qwen2.5-7B, rank 16, all seven:
        16 × 28 × ((3584+3584) + 2 × (3584+512) + (3584+3584) + 3 × (3584+18944)) = 40.4 M."""
        h, q, kv, m = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        dims = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + m,
                "up_proj": h + m, "down_proj": m + h}
        return rank * self.layers * sum(dims.get(t, 2 * h) for t in targets)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def kv_tokens(self, budget_bytes: float, dtype_bytes: int) -> int:
        return int(budget_bytes // self.kv_bytes_per_token(dtype_bytes))


def context_problem(shape: ModelShape, max_prompt_tokens: int, max_response_tokens: int, where: str) -> str | None:
    """The refusal when prompt + response limits exceed the model's context (vLLM would not start)."""
    need = max_prompt_tokens + max_response_tokens
    if shape.context is None or need <= shape.context:
        return None
    return (f"rollout.max_response_tokens: data.max_prompt_tokens + rollout.max_response_tokens = {need} tokens, "
            f"but {where} has a context of {shape.context} (max_position_embeddings) — lower them to fit "
            f"(e.g. --set rollout.max_response_tokens={max(1, shape.context - max_prompt_tokens)})")
