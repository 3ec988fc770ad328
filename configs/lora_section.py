"""The `model.lora:` section: train low-rank adapters (LoRA, built with `peft`) on a frozen base instead of every
weight. Off by default (`rank: 0`): the run is then exactly the full-parameter one.

What each key means (docs/algorithms.md "LoRA" has the maths and what does not combine with it):
a targeted linear layer y = W·x becomes y = W·x + (alpha / rank)·B·A·x, with A (rank × in) and B (out × rank)
the only trained tensors; W stays frozen. B starts at zero, so step 0's policy is the base model exactly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from configs.base import Section

# vLLM 0.32's engine argument max_lora_rank takes only these values (vllm/config/lora.py, MaxLoRARanks); the
# engines of a LoRA run are built with the smallest one that holds `rank`.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# the linear layers of a Llama/Qwen-style decoder block: attention projections and the gated MLP
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(Section):
    rank: int = Field(
        0, ge=0, le=VLLM_MAX_LORA_RANKS[-1],
        description="r, the inner dimension of each adapter (A is r × in, B is out × r); 0 = off (full-parameter "
                    f"training). At most {VLLM_MAX_LORA_RANKS[-1]} (vLLM's largest max_lora_rank) and at most the "
                    "smallest dimension of every targeted layer")
    alpha: float | None = Field(
        None, gt=0, description="scaling numerator: the adapter adds (alpha / rank)·B·A·x; null = rank (scale 1)")
    target_modules: list[str] = Field(
        list(DEFAULT_TARGETS), min_length=1,
        description="names of the linear layers that get an adapter, matched against the last part of each "
                    "module's name (peft's rule: q_proj matches model.layers.0.self_attn.q_proj); every name must "
                    "match at least one nn.Linear of the model. Default: the attention and MLP projections of "
                    "Llama/Qwen-style models")
    dropout: float = Field(
        0.0, ge=0, lt=1,
        description="probability of dropping an adapter's input in training forwards (peft lora_dropout); only 0 "
                    "is accepted: the learner keeps every dropout off so that π_prox recomputed at a step's start "
                    "equals the policy that trains (docs/algorithms.md \"LoRA\")")
    sync: Literal["adapter", "merged"] = Field(
        "adapter", description="what a weight push carries to the engines: adapter = the adapter tensors only (A and "
                               "B of every adapted layer, rank × (in + out) values each), loaded by vLLM's LoRA "
                               "support as a new adapter per version, each request finished with the adapter it "
                               "started with (docs/running.md \"LoRA\"); every push is the whole adapter "
                               "(weight_sync.mode delta does not apply); merged = the "
                               "base with W + (alpha/rank)·B·A in every adapted layer, every weight of the model, "
                               "as a full-parameter run pushes: the engines then serve one plain model, at the full model's bytes per push")
    export_merged: bool = Field(
        False, description="also write hf/step_<N>/merged/: the base with the adapter added into its weights, a "
                           "plain HF model (the adapter itself is always written to hf/step_<N>/ in peft format)")

    @field_validator("target_modules")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v) or any(not n or "." in n for n in v):
            raise ValueError(f"target_modules {v}: give distinct module names without dots (e.g. q_proj, v_proj)")
        return v

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """alpha / rank, the factor of B·A (1 when alpha is null)."""
        return 1.0 if self.alpha is None else self.alpha / self.rank

    @property
    def adapter_sync(self) -> bool:
        """Pushes carry the adapter only and engines serve it through vLLM's LoRA support."""
        return self.enabled and self.sync == "adapter"

    def engine_max_rank(self) -> int:
        """vLLM's max_lora_rank for engines that serve this adapter: the smallest allowed value ≥ rank."""
        return next(r for r in VLLM_MAX_LORA_RANKS if r >= self.rank)
