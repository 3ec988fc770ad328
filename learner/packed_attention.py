"""Attention over rows packed back to back in one sequence (the learner's packed micro-batches).

A packed micro-batch is one sequence input_ids [1, S]: its rows one after the other, no padding,
position ids restarting at 0 at every row (RoPE then sees each row as it would alone). Attention
must stay inside each row: causal within it, nothing across rows.

transformers 5.19 can do this by itself: with attention_mask=None it detects the restarts in
position_ids (`masking_utils.find_packed_sequence_indices`) and builds a dense block-diagonal causal
mask [1, 1, S, S] for SDPA. That is exact, but costs S² mask memory and attention work over every
cross-row block (16 rows of equal length: 16× the attention FLOPs of the rows alone), and the mask
keeps SDPA off its causal kernels. Instead, the implementation registered here as "packed_sdpa"
receives the row boundaries `row_bounds` (a decoder passes its extra forward keyword arguments
through to every attention call) and runs SDPA with is_causal=True on each row's slice; without
them it is transformers' "sdpa", unchanged (padded micro-batches).

With packed inputs the caller passes an all-ones 2-D attention mask, so that transformers builds no
mask (`sdpa_mask` skips an all-ones padding mask to None). Under plain "sdpa" such inputs would
attend across rows: `TokenScorer` switches "sdpa" models to "packed_sdpa" and refuses packed inputs
under any other implementation. Sliding-window layers are refused with packed inputs.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_ATTENTION = "packed_sdpa"


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, row_bounds: tuple[int, ...] | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """query [1, H, S, D], key/value [1, H_kv, S, D] -> ([1, S, H, D], None), as transformers' sdpa.

    row_bounds: start of every row in S, then S (rows + 1 entries). None: plain "sdpa"."""
    if row_bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if getattr(module, "sliding_window", None) is not None:
        raise ValueError(f"{type(module).__name__} uses sliding-window attention, which packed micro-batches do "
                         "not implement; set learner.packing=false")
    parts = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs)[0]
             for a, b in zip(row_bounds[:-1], row_bounds[1:])]
    return torch.cat(parts, dim=1), None


AttentionInterface.register(PACKED_ATTENTION, packed_sdpa)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)
