"""Loss aggregation with *global* normalisation.

A per-token loss matrix [B, T] (or a per-row loss [B]) becomes a scalar. The learner splits one
optimiser step into micro-batches on several data-parallel ranks; for the gradient not to depend on
that split, every micro-batch divides by normalisers counted over the whole step (all micro-batches,
all ranks): `LossNorm`. With `LossNorm.local(mask)` the functions reproduce the single-batch
reference definitions (verl `agg_loss`):

  token-mean               Σ l·M / Σ M
  seq-mean-token-sum       Σ_i Σ_t l·M / #non-empty rows
  seq-mean-token-mean      Σ_i (Σ_t l·M / Σ_t M) / #non-empty rows
  seq-mean-token-sum-norm  Σ l·M / T_pad   (Dr.GRPO/LUFFY constant normaliser; a sum over rows)
  row-mean                 Σ_i l_i / #rows (per-row losses such as PACS' BCE)

Deviation from the references: they normalise per micro-batch and then divide by the number of
micro-batches, which changes the gradient when micro-batches hold different token counts. Here the
global counts are used; `T_pad` is the configured maximum response length, not the padded width of
whichever micro-batch happens to be in hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossNorm:
    num_tokens: float  # Σ M over the whole optimiser step (all micro-batches, all ranks)
    num_seqs: float  # rows with at least one masked token, same scope
    num_rows: float  # all rows, same scope
    max_len: float  # T_pad for seq-mean-token-sum-norm

    @classmethod
    def local(cls, mask: torch.Tensor, max_len: int | None = None) -> LossNorm:
        """Normalisers of a single batch (what the reference implementations use)."""
        m = mask.float()
        return cls(
            num_tokens=float(m.sum()),
            num_seqs=float((m.sum(-1) > 0).sum()),
            num_rows=float(m.shape[0]),
            max_len=float(m.shape[-1] if max_len is None else max_len),
        )

    def merge(self, other: LossNorm) -> LossNorm:
        """Add the counts of another micro-batch / rank (max_len must agree)."""
        if self.max_len != other.max_len:
            raise ValueError(f"LossNorm.merge: max_len differs ({self.max_len} vs {other.max_len})")
        return LossNorm(self.num_tokens + other.num_tokens, self.num_seqs + other.num_seqs,
                        self.num_rows + other.num_rows, self.max_len)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm | None = None) -> torch.Tensor:
    """Scalar loss of `loss` [B, T] under `mask` [B, T]; `norm=None` means `LossNorm.local(mask)`."""
    norm = LossNorm.local(mask) if norm is None else norm
    m = mask.to(loss.dtype)
    lm = loss * m
    if mode == "token-mean":
        return lm.sum() / max(norm.num_tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return lm.sum() / max(norm.num_seqs, 1.0)
    if mode == "seq-mean-token-mean":
        per_row = lm.sum(-1) / m.sum(-1).clamp_min(1.0)
        return per_row.sum() / max(norm.num_seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return lm.sum() / norm.max_len
    raise ValueError(f"unknown loss_agg {mode!r}; choose one of {AGG_MODES}")


def aggregate_rows(loss: torch.Tensor, norm: LossNorm | None = None) -> torch.Tensor:
    """Mean of per-row losses [B] over all rows of the step (`row-mean`)."""
    rows = float(loss.shape[0]) if norm is None else norm.num_rows
    return loss.sum() / max(rows, 1.0)
