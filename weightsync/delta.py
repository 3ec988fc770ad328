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
dtypes changed, and when the delta would not be smaller than the dense push (``DeltaEncoder``:
over about a third of the bf16 elements changed on NCCL, a half on gloo). The receivers apply
patches to their copy of the last dense push (``apply_patch``; the gloo engine's mirror) or in place
(vLLM's sparse NCCL engine, in chunks: ``weightsync.nccl.engine.sparse_update_infos``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

import torch

from weightsync.packing import Patch
from weightsync.plane import Payload

logger = logging.getLogger(__name__)

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


def int32_patch_nbytes(changed: int, numel: int, itemsize: int) -> int:
    """Wire bytes of a patch of ``changed`` elements in vLLM's sparse NCCL format: an int32 index and
    the value per changed element (``numel``, the tensor's size, does not matter)."""
    return changed * (4 + itemsize)


# PatchCost(changed elements, tensor numel, itemsize) -> wire bytes of that tensor's patch
PatchCost = Callable[[int, int, int], int]


class DeltaEncoder:
    """Decides dense or delta for each push and builds its ``Payload`` (module docstring). Keeps the
    baseline only in mode "delta": the tensors given to ``encode`` (or their staged copies), so they
    must not be modified afterwards (the learner's gatherer yields new tensors).

    Dense fallback: a delta is sent dense instead when its patches would take at least as many wire
    bytes as the dense push (``patch_cost``, the data plane's patch format, against numel x itemsize
    per tensor). Per changed element of itemsize s: vLLM's sparse NCCL path sends 4 + s bytes
    (``int32_patch_nbytes``), so with s = 2 (bf16) a delta of more than 2 / 6 = 1/3 of the elements is
    larger than the 2 B per element of a dense push (1/2 for fp32: 4 / 8); the gloo plane sends 2 + s
    bytes plus an int32 count per 65536-element block (``weightsync.packing``), so bf16 breaks even at
    (2 - 4/65536) / 4, just under 1/2 (fp32: 2/3). Past that point a delta costs more bytes, so
    early steps or a large learning rate fall back to dense. The decision is made as the tensors
    arrive: once the patches reach the dense push's bytes (the baseline's), or no longer fit the
    staging arena, which is that large (``weightsync.staging``: patches staged on a GPU learner never
    take more host memory than the dense push, so on the gloo plane a GPU learner's delta turns
    dense from about 1/3 of the bf16 elements changed, not 1/2), the rest is not diffed."""

    def __init__(self, mode: str = "full", full_every: int = 10, patch_cost: PatchCost = int32_patch_nbytes):
        if mode not in MODES:
            raise ValueError(f"weight_sync.mode must be one of {MODES}, got {mode!r}")
        if full_every < 1:
            raise ValueError(f"weight_sync.full_every must be >= 1 (pushes between dense pushes), got {full_every}")
        self.mode, self.full_every = mode, int(full_every)
        self.patch_cost = patch_cost
        self.baseline: dict[str, torch.Tensor] | None = None

    def encode(self, named: Iterable[tuple[str, torch.Tensor]], version: int, seq: int,
               stager: Stager | None = None) -> Payload:
        """The payload of push ``seq`` (1, 2, ... per sender) of the wire-dtype tensors ``named``,
        consumed one at a time: each is diffed against its baseline on its own device (the baseline is
        copied there for that), then what the payload and the next baseline keep of it goes through
        ``stager`` (``weightsync.staging.HostStager``: host copies, the baseline's overwritten in place;
        default: kept as they are). An error raised by ``named`` propagates and drops the baseline (it
        may be half overwritten): the next push is dense."""
        stager = stager or KEEP
        base, self.baseline = self.baseline, None  # until this push is encoded
        dense = self.mode == "full" or base is None or (seq - 1) % self.full_every == 0
        budget = 0 if dense else sum(t.numel() * t.element_size() for t in base.values())
        if not dense:
            stager.expect_delta(budget, len(base))
        kept: dict[str, torch.Tensor] = {}
        patches: list[Patch] = []
        changed = numel = patch_bytes = 0
        for name, t in named:
            if name in kept:
                raise ValueError(f"parameter {name!r} appears twice in one push")
            old = None if dense else base.get(name)
            if not dense and (old is None or old.shape != t.shape or old.dtype != t.dtype):
                dense, patches = True, []  # a name, shape or dtype changed: send everything
            if not dense:
                idx, values = diff(old.to(t.device, non_blocking=True), t)
                if idx.numel():
                    patch_bytes += self.patch_cost(idx.numel(), t.numel(), t.element_size())
                    staged = (stager.patch(idx), stager.patch(values)) if patch_bytes < budget else (None,)
                    if None in staged:
                        logger.info("push #%d: after %d tensors the delta is not smaller than the dense push "
                                    "(%d bytes): sent dense", seq, len(kept) + 1, budget)
                        dense, patches = True, []
                    else:
                        patches.append(Patch(name, *staged, tuple(t.shape)))
                        changed += idx.numel()
            kept[name] = stager.weight(name, t)
            numel += t.numel()
        if not dense and set(base) != set(kept):
            dense = True  # a parameter disappeared
        if dense:
            payload = Payload(version, seq, full=list(kept.items()))
        else:
            payload = Payload(version, seq, patches=patches, changed_frac=changed / max(1, numel))
        self.baseline = kept if self.mode == "delta" else None
        return payload


class Stager(Protocol):
    """Where ``DeltaEncoder.encode`` keeps a push (``weightsync.staging.HostStager``): told first when
    the push may be a delta of a dense push of ``dense_bytes`` in ``tensors`` tensors; ``patch`` may
    return None: no room, send the push dense."""

    def expect_delta(self, dense_bytes: int, tensors: int) -> None: ...

    def weight(self, name: str, t: torch.Tensor) -> torch.Tensor: ...

    def patch(self, t: torch.Tensor) -> torch.Tensor | None: ...


class _Keep:
    """Keeps every tensor as it is (CPU tensors, the encoder alone)."""

    def expect_delta(self, dense_bytes: int, tensors: int) -> None:
        pass

    def weight(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t

    def patch(self, t: torch.Tensor) -> torch.Tensor:
        return t


KEEP = _Keep()
