"""The row the learner trains on for a LUFFY-guided sample, assembled as the reference does (the actors
build it from vLLM's output, `actors/rows.py`, and the tests compare)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GuidedRow:
    response: torch.Tensor  # [T] int64, prefix + continuation, right-padded with pad_id / truncated to T
    prefix_mask: torch.Tensor  # [T] bool, True on the first min(len(prefix), T) positions
    response_mask: torch.Tensor  # [T] float, 1 up to and including the first eos (or the last real token)


def assemble_response(prefix: Sequence[int], continuation: Sequence[int], eos_id: int, response_length: int,
                      pad_id: int) -> GuidedRow:
    """The row the learner trains on: response = (prefix + continuation)[:T], T = response_length.

    response_mask: 1 on positions 0..e where e is the first eos of the response; without an eos, 1 on
    every real (non-padding) token. prefix_mask: True on the first min(len(prefix), T) positions (the
    prefix's eos, when ρ = 1, is an off-policy token too).

    Deviations from the reference: a response without any eos that is shorter than T (a generator that
    stopped for another reason) gets mask 0 on its padding; the reference's eos mask would be 1 on the
    padding too. Responses that reach T or contain an eos are identical.
    """
    if response_length < 1:
        raise ValueError(f"response_length must be >= 1, got {response_length}")
    seq = ([int(t) for t in prefix] + [int(t) for t in continuation])[:response_length]
    n_real = len(seq)
    response = torch.full((response_length,), int(pad_id), dtype=torch.int64)
    if n_real:
        response[:n_real] = torch.tensor(seq, dtype=torch.int64)
    end = seq.index(int(eos_id)) + 1 if int(eos_id) in seq else n_real
    response_mask = torch.zeros(response_length, dtype=torch.float32)
    response_mask[:end] = 1.0
    prefix_mask = torch.zeros(response_length, dtype=torch.bool)
    prefix_mask[:min(len(prefix), response_length)] = True
    return GuidedRow(response=response, prefix_mask=prefix_mask, response_mask=response_mask)
