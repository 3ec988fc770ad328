"""The definition the learner's chunked log-probs are compared with (`learner.logprobs`)."""

from __future__ import annotations

import torch

from learner.logprobs import OUTSIDE_SUPPORT_LOGPROB, _upcast


def reference_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                             top_p: float = 1.0, top_k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Unchunked log-probs and entropies from full logits [..., V] (the definition tests compare to).

    Written from the kept-set definition, not from `support_mask`'s sort: token i survives top-k iff
    fewer than k tokens have a strictly larger z, and survives top-p iff the top-k-renormalised mass
    of the tokens with a strictly larger z is < p. O(V²) memory per position.
    """
    z = _upcast(logits) / temperature
    vocab = z.shape[-1]
    above = z[..., None, :] > z[..., :, None]  # [..., i, j]: z_j > z_i
    kept = torch.ones_like(z, dtype=torch.bool)
    if 0 < top_k < vocab:
        kept = above.sum(-1) < top_k
    if top_p < 1.0:
        q = torch.softmax(z.detach().masked_fill(~kept, float("-inf")), dim=-1)
        kept = kept & ((q[..., None, :] * above).sum(-1) < top_p)
    logp_all = torch.log_softmax(z.masked_fill(~kept, float("-inf")), dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    logp = torch.where(kept.gather(-1, targets[..., None]).squeeze(-1), logp, OUTSIDE_SUPPORT_LOGPROB)
    entropy = -(logp_all.exp() * logp_all.masked_fill(~kept, 0.0)).sum(-1)
    return logp, entropy
