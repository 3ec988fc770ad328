"""Delta pushes: only the elements whose wire-dtype bits changed since the receivers' copy.

Why: the engines serve bf16 and an fp32 update below about |w|/256 leaves the bf16 value unchanged
(bf16 keeps 8 significant bits), so between consecutive learner steps most bf16 weights are
identical. A changed bf16 element costs 4 B on the gloo plane (a uint16 offset inside its
65536-element block + the value; ``weightsync.packing``) and 6 B on vLLM's sparse NCCL path (int32
index + value), against 2 B per element dense: a delta is smaller while under a half (gloo) or a
third (NCCL) of the elements change.

Rule (``DeltaEncoder``, on learner rank 0): the baseline is the set of wire-dtype tensors every
receiver holds after the last push. A delta push carries, per tensor, the flat int32 indices where
the new tensor's bits differ from the baseline's (compared as same-width integers: exact, and
NaN-safe: an unchanged NaN is not sent, a 0.0 -> -0.0 flip is) and the new values there; tensors
with nothing changed are left out. A push is dense instead in mode "full", on pushes 1, 1 + K,
1 + 2K, ... of a sender (K = ``full_every``; push 1 covers actor restarts: every restart makes a new
sender, and nothing is known about what a new receiver holds), and when the set of names, shapes or
dtypes changed. The receivers apply patches to their copy of the last dense push (``apply_patch``;
the gloo engine's mirror) or in place (vLLM's sparse NCCL engine).
"""

from __future__ import annotations

import torch

from weightsync.packing import Patch
from weightsync.plane import Payload

MODES = ("full", "delta")
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MAX_INDEX = 2**31 - 1  # indices travel as int32


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as integers of the same width (compares bit patterns, not values)."""
    return t.view(_INT_OF_SIZE[t.element_size()])


def diff(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, values)``: the flat int32 positions where ``new``'s bits differ from ``old``'s (same
    shape and dtype) and ``new``'s values there, both 1-D."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"cannot diff {new.dtype} {tuple(new.shape)} against {old.dtype} {tuple(old.shape)}")
    if new.numel() > _MAX_INDEX:
        raise ValueError(f"a tensor of {new.numel()} elements does not fit int32 patch indices; "
                         "use weight_sync.mode=full")
    flat = new.reshape(-1)
    idx = (bits(flat) != bits(old.reshape(-1))).nonzero().squeeze(1)
    return idx.to(torch.int32), flat[idx]


def apply_patch(target: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    """``target.view(-1)[indices] = values``, in place (``target`` contiguous), after checking that
    dtypes agree and every index is inside ``target``."""
    if values.dtype != target.dtype or indices.numel() != values.numel():
        raise ValueError(f"patch of {indices.numel()} indices / {values.numel()} {values.dtype} values "
                         f"does not fit a {target.dtype} tensor")
    flat = target.view(-1)
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= flat.numel()):
        raise ValueError(f"patch index outside a tensor of {flat.numel()} elements")
    flat[indices.long()] = values


class DeltaEncoder:
    """Decides dense or delta for each push and builds its ``Payload`` (module docstring). Keeps the
    baseline only in mode "delta": the tensors given to ``encode`` themselves, not copies, so they must
    not be modified afterwards (the learner's gatherer yields new tensors)."""

    def __init__(self, mode: str = "full", full_every: int = 10):
        if mode not in MODES:
            raise ValueError(f"weight_sync.mode must be one of {MODES}, got {mode!r}")
        if full_every < 1:
            raise ValueError(f"weight_sync.full_every must be >= 1 (pushes between dense pushes), got {full_every}")
        self.mode, self.full_every = mode, int(full_every)
        self.baseline: dict[str, torch.Tensor] | None = None

    def encode(self, named: list[tuple[str, torch.Tensor]], version: int, seq: int) -> Payload:
        """The payload of push ``seq`` (1, 2, ... per sender) of the wire-dtype tensors ``named``."""
        new = dict(named)
        if len(new) != len(named):
            raise ValueError("a parameter name appears twice in one push")
        base = self.baseline
        dense = (self.mode == "full" or base is None or (seq - 1) % self.full_every == 0
                 or {n: (t.shape, t.dtype) for n, t in base.items()} != {n: (t.shape, t.dtype) for n, t in named})
        if dense:
            payload = Payload(version, seq, full=list(named))
        else:
            patches, changed = [], 0
            for name, t in named:
                idx, values = diff(base[name], t)
                if idx.numel():
                    patches.append(Patch(name, idx, values, tuple(t.shape)))
                    changed += idx.numel()
            payload = Payload(version, seq, patches=patches,
                              changed_frac=changed / max(1, sum(t.numel() for _, t in named)))
        self.baseline = new if self.mode == "delta" else None  # only once the payload exists
        return payload
