"""The learner: one FSDP2 data-parallel rank that turns a list of groups into one optimiser step.

It is algorithm-blind (algos/registry.py): for each step it
  1. lays the step out (rows, whole-group shards per rank, length-sorted micro-batches; `batching`),
  2. recomputes π_prox for its rows without grad, runs the providers `spec.requires(cfg)` names
     (reference, PRIME PRM, PURE PRM; `providers`), and all-gathers their outputs into the global
     `StepBatch`,
  3. calls `spec.advantage` once on that global batch (every rank computes the same result),
  4. for each micro-batch sums weight·component losses under the step's global `LossNorm` and
     backpropagates (`train_step`), then clips (unless `spec.clip_grad` is False) and steps AdamW with
     the scheduled LR; a non-finite gradient skips the step when `spec.skip_nonfinite_grad`.
Every rank receives the same `groups` and calls every method (they contain collectives). Models are
FSDP2-sharded when world_size > 1; a single rank trains the plain module (same maths, `fsdp=True`
forces FSDP2). How the loss is normalised and scaled for FSDP's gradient averaging: `train_step`.
The policy's log-probs are those of the distribution vLLM sampled from (its processed log-probs:
`cfg.rollout` temperature, then top-k, then top-p; `learner.logprobs`), except for specs that train on
demonstrations only (SFT), which use the plain model distribution; auxiliary models use the temperature
without truncation (`build_model`).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import algos
from algos.spec import PROX
from buffer.records import Group
from learner import batching, checkpoint
from learner.distributed import all_reduce_extremes, default_device, gather_rows, init_distributed
from learner.fsdp import DTYPES, build_scorer, ensure_sharded, make_mesh, named_full_tensors
from learner.lora import AdapterOff, adapter_weights, merge_adapters, save_adapter_config
from learner.optim import lr_at, make_adamw, optimizer_step, set_lr
from learner.providers import ProviderContext, build_providers, run_scorer
from learner.train_step import global_norm, train_microbatches


class Learner:
    """One rank. `Learner(cfg, rank, world_size, model_dir)`; then `step(groups, version)` on every rank.

    init_method: torch.distributed init URL (default env:// or, for one rank, a private local store).
    fsdp: shard the models with FSDP2; default: when world_size > 1 (one rank trains the plain module:
    same maths, no FSDP buffer copies). Micro-batches: cfg.learner.micro_batch_samples,
    micro_batch_tokens and packing (`batching`).
    """

    def __init__(self, cfg, rank: int = 0, world_size: int | None = None, model_dir: str | Path | None = None, *,
                 device: torch.device | str | None = None, init_method: str | None = None,
                 fsdp: bool | None = None):
        self.cfg = cfg
        self.rank = rank
        self.world_size = int(world_size or cfg.learner.world_size)
        model_dir = model_dir if model_dir is not None else cfg.model.path
        if model_dir is None:
            raise ValueError("the learner needs an HF model directory: pass model_dir (the tiny model is built "
                             "with tasks.tiny_model.build_tiny_model) or set model.path")
        self.model_dir = Path(model_dir)
        self.spec = algos.get(cfg.algo)
        self.device = torch.device(device) if device is not None else default_device(rank)
        init_distributed(rank, self.world_size, self.device, init_method, cfg.learner.collective_timeout_s)
        torch.manual_seed(cfg.learner.seed)
        self.mesh = make_mesh(self.device, self.world_size)
        self.dtype = cfg.model.resolved_dtype(gpu=self.device.type == "cuda")  # auto: the launch resolves it first
        self.compute_dtype = DTYPES[self.dtype]
        r = cfg.rollout  # the actors' sampling distribution (SFT-only specs: the plain model distribution)
        self.sampling = dict(temperature=1.0, top_p=1.0, top_k=0) if self.spec.trains_on_demonstrations_only else \
            dict(temperature=float(r.temperature), top_p=float(r.top_p), top_k=int(r.top_k))
        self.fsdp = self.world_size > 1 if fsdp is None else bool(fsdp)
        if not self.fsdp and self.world_size > 1:
            raise ValueError("fsdp=False needs world_size 1 (ranks share one model only through FSDP)")

        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, trust_remote_code=cfg.model.trust_remote_code)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))
        ac = cfg.learner.activation_checkpointing
        self.activation_checkpointing = self.device.type == "cuda" if ac == "auto" else bool(ac)
        self.lora = cfg.model.lora if cfg.model.lora.enabled else None  # adapters on a frozen base: learner.lora
        self.policy = self.build_model(trainable=True, truncate=True, lora=self.lora)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        self.vocab_size = int(self.policy.lm.get_output_embeddings().weight.shape[0])
        lc = cfg.learner
        self.opt = make_adamw(self.params, lc.lr, lc.betas, lc.weight_decay)
        self._reference = None
        self._ref_cache: tuple[ProviderContext, torch.Tensor] | None = None
        needs = self.spec.requires(cfg)
        self.providers = build_providers(needs - {PROX}, self)
        # π_prox is one more forward of the whole batch. The objective reads it only after an earlier
        # optimiser step of the same batch (r = π_θ/π_prox ≠ 1) or before the update (a spec requiring
        # PROX); otherwise it equals the detached log-probs of the training forward itself.
        updates = lc.mini_batches * lc.epochs
        self.prox_before_update = updates > 1 or PROX in needs
        self.total_optimizer_steps = (lc.lr_horizon_steps or lc.steps) * updates  # the LR schedule's horizon
        self.optimizer_steps = 0  # optimiser steps taken (skipped ones included): the LR schedule's clock
        self.skipped_steps = 0

    # ------------------------------------------------------------------ models
    def build_model(self, *, trainable: bool, truncate: bool = False, model_dir: str | Path | None = None,
                    lora=None):
        """A sharded `TokenScorer` initialised from the run's model directory (or `model_dir`: the teacher's), at
        the sampling temperature;
        with `truncate` (the policy) also top-k then top-p, the distribution vLLM sampled from
        (`learner.logprobs`). Auxiliary models (reference, PRM) score the untruncated distribution: a
        token outside their nucleus would otherwise get the −30 floor and a spurious KL or implicit reward.
        Trainable models (the policy, PRIME's PRM) recompute activations in backward when
        `learner.activation_checkpointing` resolves to on (auto: on a CUDA device). lora: the policy's
        `model.lora` when it trains adapters only (`learner.lora`); auxiliary models never get adapters."""
        lc, s = self.cfg.learner, self.sampling
        sampling = s if truncate else dict(s, top_p=1.0, top_k=0)
        return build_scorer(self.model_dir if model_dir is None else model_dir, mesh=self.mesh, device=self.device, dtype=self.dtype,
                            trainable=trainable, **sampling, chunk_tokens=lc.logprob_chunk_tokens,
                            activation_checkpointing=trainable and self.activation_checkpointing, shard=self.fsdp,
                            trust_remote_code=self.cfg.model.trust_remote_code, lora=lora, seed=self.cfg.seed)

    def reference(self):
        """The frozen initial policy (built once, shared by every provider that needs it). A LoRA run's is the
        policy itself with its adapters switched off (`learner.lora.AdapterOff`): no second copy of the base."""
        if self._reference is None:
            self._reference = AdapterOff(self.policy) if self.lora else self.build_model(trainable=False)
        return self._reference

    def reference_logprobs(self, ctx: ProviderContext) -> torch.Tensor:
        """log π_ref of this rank's rows for the step of `ctx`, computed once per step however many
        providers ask (the KL term and PRIME's frozen reference share it)."""
        if self._ref_cache is None or self._ref_cache[0] is not ctx:
            self._ref_cache = (ctx, run_scorer(self.reference(), ctx))
            ensure_sharded(self.policy)  # AdapterOff ran the policy's root unit, which stays gathered after it
        return self._ref_cache[1]

    # ------------------------------------------------------------------ the step
    def step(self, groups: list[Group], version: int) -> dict[str, float]:
        """One learner step on the global batch `groups` (identical on every rank); returns its metrics.

        The batch is cut into `learner.mini_batches` mini-batches of whole groups and each is trained
        `learner.epochs` times: mini_batches × epochs optimiser steps, all against the π_prox and
        advantages computed once, before the first of them. version: the version of the weights this
        step starts from (they compute π_prox; staleness is measured against it). The learner keeps no
        version: the driver owns it (`launch.state.position`), and the weights this step leaves are its
        version + 1 (a version is a learner step, one weight push, however many optimiser steps it
        takes). Metrics of the optimiser steps are averaged over them; "optim/steps" counts optimiser
        steps taken so far (the LR schedule's clock). The keys are the learner's only (docs/metrics.md):
        the driver adds its own, and a key both wrote would be refused (`launch.loop.metrics.merge_rows`).
        """
        t0 = time.perf_counter()
        cfg, spec = self.cfg, self.spec
        rows = batching.rows_from_groups(groups, self.vocab_size)
        batch = batching.global_step_batch(rows, self.device, self.optimizer_steps)
        metrics: dict[str, float] = {}
        if not self.prox_before_update:
            batch.old_logprobs = None  # filled per micro-batch from the training forward (train_step)
        if self.prox_before_update or self.providers:
            self._model_inputs(batch, rows, metrics)
        with torch.no_grad():
            if spec.advantage is not None:
                adv, adv_metrics = spec.advantage(batch, cfg)
                metrics |= {k: float(v) for k, v in adv_metrics.items()}
            else:
                adv = torch.zeros_like(batch.response_mask)
        t_train = time.perf_counter()
        updates = [self._update(batch, adv, rows, idx) for _ in range(cfg.learner.epochs)
                   for idx in batching.split_minibatches(rows, cfg.learner.mini_batches)]
        for k in dict.fromkeys(k for u in updates for k in u):  # every key any optimiser step reported
            values = [u[k] for u in updates if k in u]
            metrics[k] = sum(values) / len(values)
        metrics["time/update_s"] = time.perf_counter() - t_train
        elapsed = time.perf_counter() - t0
        tokens = sum(r.num_tokens for r in rows)
        metrics |= batching.staleness_metrics(rows, int(version))
        metrics |= {
            "optim/steps": float(self.optimizer_steps),
            "optim/updates_per_step": float(len(updates)), "optim/skipped_steps": float(self.skipped_steps),
            "reward/mean": float(batch.rewards.mean()), "batch/groups": float(len(groups)),
            "batch/rows": float(len(rows)), "batch/tokens": float(tokens),
            "time/learner_compute_s": elapsed, "throughput/learner_tokens_per_s": tokens / elapsed,
            "throughput/learner_samples_per_s": len(rows) / elapsed,
        }
        return metrics

    def _update(self, batch, adv: torch.Tensor, rows: list[batching.Row], indices: list[int]) -> dict[str, float]:
        """One optimiser step on the mini-batch of global rows `indices` (whole groups), normalised by
        that mini-batch's global counts; returns its metrics."""
        cfg, spec = self.cfg, self.spec
        shards, mbs = self._layout(rows, indices)
        norm = global_norm(batch, mbs, cfg)
        lr = lr_at(self.optimizer_steps, peak=cfg.learner.lr, warmup=cfg.learner.warmup_steps,
                   total=self.total_optimizer_steps, schedule=cfg.learner.lr_schedule)
        set_lr(self.opt, lr)
        metrics = train_microbatches(self.policy, spec, cfg, batch, adv, mbs, norm, self.world_size,
                                     prox_from_forward=not self.prox_before_update)
        gnorm, stepped = optimizer_step(self.opt, self.params,
                                        max_norm=cfg.learner.grad_clip if spec.clip_grad else None,
                                        skip_nonfinite=spec.skip_nonfinite_grad,
                                        what=f"{spec.name} optimiser step {self.optimizer_steps}")
        self.skipped_steps += int(not stepped)
        self.optimizer_steps += 1
        return metrics | {"optim/grad_norm": gnorm, "optim/lr": lr, "optim/stepped": float(stepped),
                          "batch/response_tokens": norm.num_tokens, "batch/microbatches_per_rank": float(len(mbs))}

    def _layout(self, rows: list[batching.Row], indices: list[int]):
        """(per-rank row shards, this rank's micro-batches) for the global rows `indices`; identical plans
        are checked across ranks."""
        shards = batching.shard_groups(rows, self.world_size, indices)
        whole = self.spec.whole_groups_per_microbatch
        lc = self.cfg.learner
        plans = [batching.plan_microbatches(rows, s, lc.micro_batch_samples, whole_groups=whole,
                                            max_tokens=lc.micro_batch_tokens, packed=lc.packing) for s in shards]
        target = max(len(p) for p in plans)
        plans = [batching.equalize(p, target, rows, whole) for p in plans]
        lo, hi = all_reduce_extremes(batching.layout_digest(rows, plans))
        if lo != hi:
            raise RuntimeError("learner ranks received different batches; every rank must get the same groups "
                               "in the same order")
        mbs = [batching.make_microbatch(rows, idx, self.pad_id, self.device, lc.packing) for idx in plans[self.rank]]
        return shards, mbs

    def _model_inputs(self, batch, rows: list[batching.Row], metrics: dict[str, float]) -> None:
        """Fill π_prox and every provider output into `batch`, each computed for this rank's rows (laid out
        over the whole batch) and all-gathered into the global row order."""
        shards, mbs = self._layout(rows, list(range(len(rows))))
        local = shards[self.rank]
        width = batch.response_mask.shape[1]
        lidx = torch.tensor(local, dtype=torch.long, device=self.device)
        ctx = ProviderContext(rows=rows, local=local, microbatches=mbs, width=width,
                              old_logprobs=torch.zeros(len(local), width, device=self.device),
                              response_mask=batch.response_mask[lidx], rewards=batch.rewards[lidx],
                              num_rows=len(rows), step=self.optimizer_steps)
        if self.prox_before_update:
            t = time.perf_counter()
            ctx.old_logprobs = run_scorer(self.policy, ctx) * ctx.response_mask
            batch.old_logprobs = gather_rows(ctx.old_logprobs, shards, self.rank, len(rows))
            metrics["time/logprob_s"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            for provider in self.providers.values():
                for name, value in provider(ctx).items():
                    full = gather_rows(value, shards, self.rank, len(rows))
                    if name == "ref_logprobs":
                        batch.ref_logprobs = full
                    else:
                        batch.extras[name] = full
                metrics |= provider.metrics()
        finally:
            self._ref_cache = None
        metrics["time/aux_models_s"] = time.perf_counter() - t

    # ------------------------------------------------------------------ weights and checkpoints
    def named_full_weights(self, dtype: torch.dtype | None = None):
        """(HF name, full tensor) per parameter. A collective: EVERY rank must iterate it to the end (rank 0
        hands the tensors to the weight-sync sender, the others drain it).
        dtype: the serving dtype (what the sender pushes): `learner.gather.serving_weights`, one FSDP unit
        at a time, every tensor a new one. None: the fp32 masters, one `full_tensor()` per parameter (an
        unsharded policy yields its live parameters). A LoRA policy yields its adapter tensors only under peft's
        names (`model.lora.sync: adapter`, `learner.lora.adapter_weights`), or the base with its adapters merged
        in (`sync: merged`, `learner.lora.merge_adapters`: new tensors)."""
        from learner.gather import serving_weights

        if self.lora and self.lora.adapter_sync:
            yield from adapter_weights(self.policy, dtype or torch.float32)
            return
        named = named_full_tensors(self.policy) if dtype is None else serving_weights(self.policy, dtype)
        yield from merge_adapters(named, self.lora.scale) if self.lora else named

    def save(self, path: str | Path, extra_state: dict | None = None) -> Path:
        """Write this learner's part of a checkpoint into the new (or empty) directory `path`: every rank its
        own shards of the policy and optimiser, its RNG, the providers' state; rank 0 the HF config and
        tokenizer (for exports), `extra_state` and, once every rank is done, learner_state.json. Every
        rank must call it. A checkpoint counts for a resume only once `checkpoint.commit` has marked it
        (the driver does, after adding the buffer snapshot); see `learner.checkpoint`."""
        path = Path(path)
        checkpoint.prepare_dir(path, self.rank)
        checkpoint.save_sharded(path / "policy", self.policy, self.opt, trainable_only=self.lora is not None)
        checkpoint.save_rng(path, self.rank)
        for provider in self.providers.values():
            provider.save(path, self.rank)
        if self.rank == 0:
            checkpoint.save_hf_config(path, self.policy.lm, self.compute_dtype, self.tokenizer,
                                      self.model_dir if self.cfg.model.trust_remote_code else None)
            checkpoint.write_json(path / "extra_state.json", extra_state or {}, "extra_state")
            if self.lora:
                save_adapter_config(path, self.lora, self.model_dir)
        checkpoint.finish_learner_part(path, self.rank, {
            "format": 3, "algo": self.spec.name, "optimizer_steps": self.optimizer_steps,
            "skipped_steps": self.skipped_steps, "world_size": self.world_size, "providers": sorted(self.providers),
            **({"lora": self.lora.model_dump()} if self.lora else {})})
        return path

    def load(self, path: str | Path) -> dict:
        """Restore the learner's part of a checkpoint written by `save` (by any number of ranks: the shards are
        redistributed); returns its extra_state. Every rank must call it."""
        import json

        path = Path(path)
        state_file = path / checkpoint.STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not a complete learner checkpoint (no {checkpoint.STATE_FILE})")
        state = json.loads(state_file.read_text())
        if state["algo"] != self.spec.name:
            raise ValueError(f"{path} was saved by a {state['algo']!r} run; this learner runs {self.spec.name!r} "
                             "(to start from its weights, pass its HF export as model_dir: <run>/hf/step_<N>, or "
                             "learner.checkpoint.export_hf(checkpoint, out))")
        saved, ours = state.get("lora"), self.lora.model_dump() if self.lora else None
        if saved != ours:
            raise ValueError(f"{path} holds a policy trained with model.lora={saved}; this run has model.lora={ours} "
                             "(a resume keeps model.lora as it was)")
        checkpoint.load_sharded(path / "policy", self.policy, self.opt, trainable_only=self.lora is not None)
        checkpoint.load_rng(path, self.rank)
        for provider in self.providers.values():
            provider.load(path)
        self.optimizer_steps = checkpoint.optimizer_steps(state)
        self.skipped_steps = int(state["skipped_steps"])
        return json.loads((path / "extra_state.json").read_text())
