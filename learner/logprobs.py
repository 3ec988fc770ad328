"""Per-token log-probs and entropy of a causal LM, computed in chunks of tokens.

Why chunks: the [tokens, vocab] logits of a whole micro-batch are the largest tensor of an RL step
(4k tokens × 150k vocab × 4 bytes = 2.4 GB). Here the decoder runs once, the final hidden states of
the *response* positions are gathered into a flat [N, H] matrix, and each chunk of
`chunk_tokens` rows goes through the LM head, log-softmax and entropy on its own. With gradients,
every chunk runs under non-reentrant activation checkpointing, so autograd keeps only the chunk's
[n, H] hidden input and recomputes its logits in backward: at most one chunk's logits exist at a time.

`TokenScorer` wraps an HF causal LM so that the decoder *and* the chunked head run inside one
`forward` (FSDP2 unshards the root's parameters — embeddings, final norm, LM head — only inside the
root module's forward/backward). Its parameters keep the HF names under the prefix `lm.`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are promoted to float32 for the softmax; float32/float64 stay."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _head_chunk(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(target) and entropy for one chunk: h [n, H], targets [n] -> ([n], [n]), at least float32."""
    logits = _upcast(F.linear(h, weight, bias))
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    probs = torch.softmax(logits, dim=-1)
    entropy = logz - (probs * logits).sum(-1)
    return logp, entropy


def chunked_token_logprobs(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, *,
                           temperature: float = 1.0, chunk_tokens: int = 4096, with_entropy: bool = False,
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `targets` [N] under logits = head(hidden) / temperature.

    hidden [N, H] are the final hidden states that predict each target. Returns [N] tensors (float32,
    or float64 for float64 inputs);
    entropy is None unless `with_entropy`. Memory: one [chunk_tokens, vocab] logits block at a time,
    in forward and (thanks to checkpointing) in backward.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"{hidden.shape[0]} hidden rows for {targets.shape[0]} targets")
    weight, bias = head.weight, head.bias
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start:start + chunk_tokens]
        t = targets[start:start + chunk_tokens]
        if grad:
            lp, ent = checkpoint(_head_chunk, h, weight, bias, t, temperature, with_entropy,
                                 use_reentrant=False)
        else:
            lp, ent = _head_chunk(h, weight, bias, t, temperature, with_entropy)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = _upcast(hidden.new_zeros(0))
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def reference_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Unchunked log-probs and entropies from full logits [..., V] (the definition tests compare to)."""
    z = _upcast(logits) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


class TokenScorer(nn.Module):
    """An HF causal LM whose forward returns per-token log-probs of given target positions.

    forward(input_ids [b, L], attention_mask [b, L] or None, positions [N] (flat indices into b·L of
    the hidden states that predict each target), targets [N]) -> (logp [N], entropy [N] or None).
    """

    def __init__(self, lm: nn.Module, *, temperature: float = 1.0, chunk_tokens: int = 4096,
                 autocast_dtype: torch.dtype | None = None):
        super().__init__()
        self.lm = lm
        self.temperature = float(temperature)
        self.chunk_tokens = int(chunk_tokens)
        self.autocast_dtype = autocast_dtype  # bf16 compute for unsharded fp32 models (FSDP uses its policy)
        if lm.get_output_embeddings() is None:
            raise ValueError(f"{type(lm).__name__} has no output embeddings (LM head); need a causal LM")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor,
                targets: torch.Tensor, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        dt = self.autocast_dtype
        with torch.autocast(input_ids.device.type, dtype=dt or torch.bfloat16, enabled=dt is not None):
            out = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            hidden = out.last_hidden_state
            flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
            return chunked_token_logprobs(flat, self.lm.get_output_embeddings(), targets,
                                          temperature=self.temperature, chunk_tokens=self.chunk_tokens,
                                          with_entropy=with_entropy)
