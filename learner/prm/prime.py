"""PRIME's implicit process reward model π_φ as the provider of extras["prime_q"].

π_φ is a causal LM initialised from the policy checkpoint, sharded like the policy, trained with its
own AdamW (`prime.prm_lr`, betas (0.9, 0.999), no weight decay, constant LR, grad clip
`prime.prm_grad_clip`) on the loss `prime.prm_loss`, always reduced the same way:
  L = Σ_i w_i·ℓ_i / (rows of the whole step, all ranks)
whatever the micro-batch split and world size (each micro-batch adds its rows' sum divided by that
global count), with q = log π_φ − log π_ref, π_ref = the frozen initial policy (`prime.ref = freeze`) or
the batch's π_prox (`prime.ref = policy`), v_i = the verifier reward clamped to [0, 1]:
  ce               ℓ_i = BCE(σ(β Σ_t q_{i,t} M_{i,t}), v_i), w_i = 1 (`algos.prime.prm.prm_ce_loss`).
  dpo, bon_acc,    PRIME-verl's detached DPO (`algos.prime.prm.prm_detach_dpo_loss`, bon_mode none /
  bon_rm           bon_acc / bon_rm): a no-grad forward of π_φ *before* the update gives every row's
                   Q_bc = Σ_t q_t M_t; each row's group members' Q_bc and v (`group_members`; ranks hold
                   whole groups) are the detached targets of the grad forward (PRIME-verl update=reverse;
                   one extra forward). dpo is the reference's mean over rows; for bon_* the reference sums
                   w_i·ℓ_i per micro-batch and divides by the micro-batches per mini-batch, which equals
                   this reduction at its recipe's reward_model.micro_batch_size_per_gpu = 1.
One PRM optimiser step per learner step (the step's batch is PRIME's mini-batch). Update order
(`prime.update`, ALGORITHMS.md / REFERENCE_NOTES §2.4):
  single  the q returned come from the same forward pass that produces the PRM loss, i.e. from π_φ
          *before* this step's PRM update (PRIME-orig `after`);
  double  update first, then re-score with the updated π_φ (no grad) and return those q (verl `before`).
`prime.prm_update=frozen` (the paper's offline PRM): from learner step `prime.prm_frozen_after` on, no grad
forward and no PRM step; q = one no-grad forward of π_φ as it is, prime/prm_loss = its CE on the step's rows
(the same reduction), prime/prm_version stays where it stopped.
A non-finite PRM gradient skips the PRM step (counted in prime/prm_skipped); it never stops training.
FSDP averages gradients over ranks, so the loss is multiplied by the world size (as the policy's).
Metrics: prime/prm_loss, prime/prm_grad_norm, prime/prm_version (PRM optimiser steps so far),
prime/prm_skipped, prime/prm_lr.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from algos.prime.prm import DETACH_BON_MODES, group_members, prm_ce_loss, prm_detach_dpo_loss
from learner.checkpoint import load_sharded, save_sharded, write_json
from learner.distributed import all_reduce_sum
from learner.optim import make_adamw, optimizer_step
from learner.provider_base import ModelHost, Provider, ProviderContext, run_scorer


class ImplicitPRM(Provider):
    """The "prime_q" provider (module docstring). `prime.update`, `prime.ref` and `prime.prm_loss` take the
    values `algos.prime.options` declares (the config refuses any other)."""

    def __init__(self, host: ModelHost):
        pc = host.cfg.prime
        self.pc = pc
        self.world_size = host.world_size
        self.rank = host.rank
        self.model = host.build_model(trainable=True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = make_adamw(self.params, pc.prm_lr, (0.9, 0.999), 0.0)
        self.host = host
        if pc.ref == "freeze":
            host.reference()
        self.version = 0
        self.skipped = 0
        self._metrics: dict[str, float] = {}

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        pc = self.pc
        ref = self.host.reference_logprobs(ctx) if pc.ref == "freeze" else ctx.old_logprobs
        mask = ctx.response_mask
        acc = ctx.rewards.float().clamp(0.0, 1.0)
        pos = {g: i for i, g in enumerate(ctx.local)}
        loss_sum = [0.0]
        if pc.prm_update == "frozen" and ctx.step >= pc.prm_frozen_after:
            return self._frozen(ctx, ref, acc)
        targets = None if pc.prm_loss == "ce" else self._detached_targets(ctx, ref, acc)

        def backward(mb, logp: torch.Tensor) -> None:
            if mb.dummy:
                (logp.sum() * 0.0).backward()
                return
            idx = torch.tensor([pos[g] for g in mb.rows], dtype=torch.long, device=logp.device)
            m = mask[idx, :mb.width]
            q = (logp - ref[idx, :mb.width]) * m
            if targets is None:
                loss = prm_ce_loss(q, acc[idx], m, pc.beta, reduction="sum")
            else:
                q_bc, acc_bc, members = targets
                loss = prm_detach_dpo_loss(q, acc[idx], m, q_bc[idx], acc_bc[idx], pc.beta,
                                           DETACH_BON_MODES[pc.prm_loss], bc_mask=members[idx], reduction="sum")
            loss = loss / max(ctx.num_rows, 1)
            (loss * self.world_size).backward()
            loss_sum[0] += float(loss.detach())

        prm_logp = run_scorer(self.model, ctx, grad=True, per_microbatch=backward)
        norm, stepped = optimizer_step(self.opt, self.params, max_norm=pc.prm_grad_clip, skip_nonfinite=True,
                                       what="PRIME PRM")
        self.version += int(stepped)
        self.skipped += int(not stepped)
        if pc.update == "double":
            prm_logp = run_scorer(self.model, ctx)
        (loss,) = all_reduce_sum(loss_sum)
        self._metrics = {"prime/prm_loss": loss, "prime/prm_grad_norm": norm,
                         "prime/prm_version": float(self.version), "prime/prm_skipped": float(self.skipped),
                         "prime/prm_lr": pc.prm_lr}
        return {"prime_q": (prm_logp - ref) * mask}

    def _frozen(self, ctx: ProviderContext, ref: torch.Tensor, acc: torch.Tensor) -> dict[str, torch.Tensor]:
        """prime.prm_update=frozen: q from a no-grad forward of the untouched π_φ, its CE logged."""
        mask = ctx.response_mask
        q = (run_scorer(self.model, ctx) - ref) * mask
        local = float(prm_ce_loss(q, acc, mask, self.pc.beta, reduction="sum")) if len(ctx.local) else 0.0
        (loss,) = all_reduce_sum([local / max(ctx.num_rows, 1)])
        self._metrics = {"prime/prm_loss": loss, "prime/prm_grad_norm": 0.0,
                         "prime/prm_version": float(self.version), "prime/prm_skipped": float(self.skipped),
                         "prime/prm_lr": 0.0}
        return {"prime_q": q}

    def _detached_targets(self, ctx: ProviderContext, ref: torch.Tensor,
                          acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Q_bc, acc_bc, members) [b_local, n_max] of the detached DPO losses: a no-grad forward of π_φ
        before its update, each row's sequence sum Σ_t q_t M_t, broadcast over its group's members."""
        before = run_scorer(self.model, ctx)
        seq = ((before - ref) * ctx.response_mask).sum(-1)
        gid = torch.tensor([ctx.rows[g].group for g in ctx.local], dtype=torch.long, device=seq.device)
        q_bc, members = group_members(seq, gid)
        acc_bc, _ = group_members(acc.to(seq.device), gid)
        return q_bc, acc_bc, members

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def save(self, directory: Path, rank: int) -> None:
        """π_φ's weights and AdamW state, each rank its own shards (`learner.checkpoint.save_sharded`), into
        prime_prm/shards; its counters into prime_prm/prm_state.json (rank 0). Every rank must call it."""
        d = directory / "prime_prm"
        save_sharded(d / "shards", self.model, self.opt)
        if rank == 0:
            write_json(d / "prm_state.json", {"version": self.version, "skipped": self.skipped}, "PRM state")

    def load(self, directory: Path) -> None:
        d = directory / "prime_prm"
        if not (d / "prm_state.json").is_file():
            raise FileNotFoundError(f"{directory} holds no PRIME PRM state (prime_prm/prm_state.json); it was "
                                    "not saved by a PRIME run")
        load_sharded(d / "shards", self.model, self.opt)
        state = json.loads((d / "prm_state.json").read_text())
        self.version, self.skipped = int(state["version"]), int(state["skipped"])
