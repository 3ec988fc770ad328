"""Per-token log-probs and entropy of a causal LM under the distribution the actors sample from,
computed in chunks of tokens.

Why chunks: the [tokens, vocab] logits of a whole micro-batch are the largest tensor of an RL step
(4k tokens × 150k vocab × 4 bytes = 2.4 GB). Here the decoder runs once, the final hidden states of
the *response* positions are gathered into a flat [N, H] matrix, and each chunk of
`chunk_tokens` rows goes through the LM head, the sampling transform, log-softmax and entropy on its
own. With gradients, every chunk runs under non-reentrant activation checkpointing, so autograd keeps
only the chunk's [n, H] hidden input and recomputes its logits in backward: at most one chunk's
logits (and, when truncating, its sort buffers) exist at a time.

The sampling distribution (`rollout.temperature`, `rollout.top_p`, `rollout.top_k`) mirrors what vLLM
0.32 samples from and reports as `logprobs_mode="processed_logprobs"` (actors/engine.py). vLLM's CPU
path — `Sampler.sample` (vllm/v1/sample/sampler.py) then `TopKTopPSampler.forward_cpu` and
`apply_top_k_top_p_pytorch` (vllm/v1/sample/ops/topk_topp_sampler.py), which take the processed
log-probs as `log_softmax` of the masked logits right after masking — does, per position:
  1. z = float32(logits) / T.
  2. top-k, active when 0 < k < V (0 and -1 mean off, and so does k ≥ V): tokens with z below the
     k-th largest value are set to -inf; every token tied with the k-th value is kept.
  3. top-p, active when p < 1: sort the top-k-masked z ascending, softmax, cumulative sum c; a token
     is dropped where c ≤ 1 − p; the largest token is always kept ("keep at least one"). Equivalently
     a token is kept iff the top-k-renormalised mass of the tokens sorted above it is < p.
  4. log π(y) = log_softmax(masked z)[y]: the temperature-scaled log-prob renormalised over the kept
     set, -inf outside it.
Top-k is applied before top-p, and top-p measures mass under the top-k-renormalised distribution.
(On CUDA, processed log-probs disable FlashInfer and vLLM uses its Triton kernel
`apply_top_k_top_p_triton`, which aims at the same definition without a full sort; its tie handling
was not checked.) With top_p = 1 and top-k off no sort runs here: plain log-softmax of z.

Deviations from vLLM:
  - Ties at the top-p boundary: vLLM keeps the tied tokens its (unstable) sort happens to place last —
    an arbitrary subset; we keep every token whose z equals the smallest kept z (a superset of vLLM's
    set, so a token vLLM sampled is never dropped for a tie). Only a boundary falling inside a group of
    exactly equal logits (e.g. identical untrained embedding rows) is affected.
  - The kept set is recomputed from the learner's logits, which differ from vLLM's in rounding
    (other kernels, bf16): a token whose cumulative mass lies within rounding of 1 − p, or whose logit
    ties the k-th within rounding, can be kept by one side and dropped by the other.
  - A target outside the kept set has log π = -inf for vLLM; we return the finite floor
    `OUTSIDE_SUPPORT_LOGPROB` (-30) with zero gradient (the truncation is a step function of the
    logits: no small change brings the token back). This happens for stale rows (the token was in the
    old policy's nucleus, not in the current one) and for reference/PRM models scored with the same
    transform. Why -30: exp(-30) ≈ 1e-13 makes every ratio π/μ of a vLLM-sampled token ≈ 0 (a token
    with log μ < -20 is practically never sampled), while exp(+30) ≈ 1e13 keeps k3-style estimators
    and their gradients finite in float32 (-inf would give NaN). Tokens inside the kept set are never
    clamped, even below -30.
  - vLLM samples greedily when T < 1e-5 and then reports log_softmax of the raw logits (no temperature,
    no truncation); here any T > 0 is applied as given.

`TokenScorer` wraps an HF causal LM so that the decoder *and* the chunked head run inside one
`forward` (FSDP2 unshards the root's parameters — embeddings, final norm, LM head — only inside the
root module's forward/backward). Its parameters keep the HF names under the prefix `lm.`.
Packed micro-batches (`learner.batching.MicroBatch.row_bounds`): `TokenScorer` switches an "sdpa"
model to `learner.packed_attention`'s "packed_sdpa" (identical without row bounds) so that attention
stays inside each packed row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from learner.packed_attention import PACKED_ATTENTION

OUTSIDE_SUPPORT_LOGPROB = -30.0  # log π returned for a target the top-k/top-p truncation dropped


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are promoted to float32 for the softmax; float32/float64 stay."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Raise ValueError for settings vLLM would reject (named by their `rollout.*` config keys)."""
    if not temperature > 0:
        raise ValueError(f"rollout.temperature must be > 0 for log-probs, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"rollout.top_p must be in (0, 1], got {top_p}; use 1 to switch nucleus sampling off")
    if int(top_k) != top_k or top_k < -1:
        raise ValueError(f"rollout.top_k must be an integer ≥ -1, got {top_k}; use 0 (or -1) to switch top-k off")


def support_mask(z: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor | None:
    """Tokens kept by vLLM's top-k then top-p (module docstring, steps 2-3) for scaled logits z [n, V].

    Returns bool [n, V], or None when nothing can be dropped (top_p ≥ 1 and top-k off: no sort).
    Ties at the top-k and the top-p boundary are all kept. No gradient flows through the mask.
    """
    z = z.detach()
    vocab = z.shape[-1]
    k_on = 0 < top_k < vocab
    if top_p >= 1.0:
        return z >= z.topk(top_k, dim=-1).values[:, -1:] if k_on else None
    srt = z.sort(dim=-1).values  # ascending, as vLLM
    if k_on:
        srt = srt.masked_fill(srt < srt[:, vocab - top_k:vocab - top_k + 1], float("-inf"))
    cum = srt.softmax(dim=-1).cumsum_(dim=-1)
    # 1 − p in the logits' dtype, as vLLM computes it from its float32 copy of p
    dropped = (cum <= 1 - torch.tensor(top_p, dtype=cum.dtype, device=cum.device)).sum(-1, keepdim=True)
    threshold = srt.gather(-1, dropped.clamp_(max=vocab - 1))  # the largest token always stays
    return z >= threshold


def _head_chunk(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, top_p: float, top_k: int, with_entropy: bool, entropy_grad: bool = True,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(target) and entropy for one chunk: h [n, H], targets [n] -> ([n], [n]), at least float32.
    The entropy comes last and, without `entropy_grad`, builds no graph: it saves no tensor for
    backward, so the checkpoint's recompute (which stops once every saved tensor is back) never
    reaches it, and a metric-only entropy costs one pass over the chunk's logits, in forward only."""
    logits = _upcast(F.linear(h, weight, bias))
    if temperature != 1.0:
        logits = logits / temperature
    kept = support_mask(logits, top_p, top_k)
    if kept is None:
        z = logits
    else:
        z = logits.masked_fill(~kept, float("-inf"))
    logz = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - logz
    if kept is not None:
        logp = torch.where(kept.gather(-1, targets[:, None]).squeeze(-1), logp, OUTSIDE_SUPPORT_LOGPROB)
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
        probs = torch.softmax(z, dim=-1)
        finite = z if kept is None else logits.masked_fill(~kept, 0.0)  # 0·(-inf) would be NaN
        entropy = logz - torch.einsum("nv,nv->n", probs, finite)  # a batched dot: no [n, V] product
    return logp, entropy


def chunked_token_logprobs(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, *,
                           temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                           chunk_tokens: int = 4096, with_entropy: bool = False, entropy_grad: bool = True,
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `targets` [N] under vLLM's sampling distribution of head(hidden).

    hidden [N, H] are the final hidden states that predict each target. The distribution is
    softmax(head(hidden) / temperature) truncated by top-k then top-p and renormalised (module
    docstring; top_k 0 or -1 = off, top_p 1 = off); a target outside the kept set gets
    `OUTSIDE_SUPPORT_LOGPROB` with zero gradient; the entropy is that of the truncated distribution.
    Returns [N] tensors (float32, or float64 for float64 inputs); entropy is None unless
    `with_entropy`; with `entropy_grad=False` it is detached (a metric: no gradient, not recomputed in
    backward). Memory: one chunk's [chunk_tokens, vocab] logits (plus, when truncating, its sort
    buffers) at a time, in forward and (thanks to checkpointing) in backward.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"{hidden.shape[0]} hidden rows for {targets.shape[0]} targets")
    check_sampling(temperature, top_p, top_k)
    weight, bias = head.weight, head.bias
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start:start + chunk_tokens]
        t = targets[start:start + chunk_tokens]
        args = (h, weight, bias, t, temperature, top_p, top_k, with_entropy, entropy_grad)
        lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False) if grad else _head_chunk(*args)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = _upcast(hidden.new_zeros(0))
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


class TokenScorer(nn.Module):
    """An HF causal LM whose forward returns per-token log-probs of given target positions.

    forward(input_ids [b, L], attention_mask [b, L] or None, positions [N] (flat indices into b·L of
    the hidden states that predict each target), targets [N]) -> (logp [N], entropy [N] or None),
    under the sampling distribution (temperature, top_p, top_k) of `chunked_token_logprobs`.
    Packed rows (b = 1): position_ids [1, L] restarting at 0 per row and row_bounds (start of each row,
    then L); attention_mask is then ignored. Needs the model's attention to be "sdpa" (switched to
    "packed_sdpa" here) or "packed_sdpa".
    """

    def __init__(self, lm: nn.Module, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 chunk_tokens: int = 4096, autocast_dtype: torch.dtype | None = None):
        super().__init__()
        check_sampling(temperature, top_p, top_k)
        self.lm = lm
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.chunk_tokens = int(chunk_tokens)
        self.autocast_dtype = autocast_dtype  # bf16 compute for unsharded fp32 models (FSDP uses its policy)
        if lm.get_output_embeddings() is None:
            raise ValueError(f"{type(lm).__name__} has no output embeddings (LM head); need a causal LM")
        if getattr(lm.config, "_attn_implementation", None) == "sdpa":
            lm.set_attn_implementation(PACKED_ATTENTION)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor,
                targets: torch.Tensor, with_entropy: bool = False, position_ids: torch.Tensor | None = None,
                row_bounds: tuple[int, ...] | None = None, entropy_grad: bool = True,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        packed = {}
        if row_bounds is not None:
            impl = getattr(self.lm.config, "_attn_implementation", None)
            if impl != PACKED_ATTENTION:
                raise ValueError(f"packed micro-batches need the model's attention to be 'sdpa', got {impl!r}; set "
                                 "learner.packing=false")
            # an all-ones mask: transformers builds none, and packed_sdpa cuts attention at row_bounds
            packed = dict(position_ids=position_ids, row_bounds=row_bounds)
            attention_mask = torch.ones_like(input_ids)
        dt = self.autocast_dtype
        with torch.autocast(input_ids.device.type, dtype=dt or torch.bfloat16, enabled=dt is not None):
            out = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **packed)
            hidden = out.last_hidden_state
            flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
            return chunked_token_logprobs(flat, self.lm.get_output_embeddings(), targets,
                                          temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                          chunk_tokens=self.chunk_tokens, with_entropy=with_entropy,
                                          entropy_grad=entropy_grad)
