"""Loading an HF causal LM and sharding it with FSDP2 (`fully_shard`); full-weight gather and load.

Why:
- Every decoder block is its own FSDP unit (its parameters are all-gathered just before it runs and
  freed after), and the `TokenScorer` wrapper is the root unit: embeddings, final norm and LM head
  are gathered for the whole forward, which covers the chunked log-prob head (`learner.logprobs`).
- bf16 training keeps fp32 master weights and optimiser state; `MixedPrecisionPolicy` casts the
  gathered parameters to bf16 for compute and reduces gradients in fp32. Frozen models (reference,
  scorers) are simply loaded in the compute dtype.
- Dropout is switched off (π_prox, recomputed without grad, must equal π_θ at the start of a step).
- A world of one rank keeps the plain module by default (`shard=False`; bf16 via autocast): FSDP2
  with a single rank only adds buffer copies and hooks (bench/RESULTS.md).
- Full weights are produced parameter by parameter (`full_tensor()`, a collective every rank joins),
  so the weight-sync stream holds one unsharded tensor at a time (a checkpoint collects them all in
  rank 0's CPU memory); tied parameters appear once, under the name `named_parameters` gives them
  (HF re-ties them on load).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from learner.logprobs import TokenScorer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PREFIX = "lm."


def hf_name(name: str) -> str:
    """HF parameter name of a `TokenScorer` parameter (wrapper prefixes removed)."""
    for p in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(p, "")
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def load_causal_lm(model_dir: str | Path, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not an HF model directory (no config.json)")
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    disable_dropout(lm)
    return lm


def disable_dropout(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The transformer blocks (HF `_no_split_modules` classes)."""
    names = set(getattr(lm, "_no_split_modules", None) or [])
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find the decoder blocks of {type(lm).__name__} (no _no_split_modules)")
    return layers


def build_scorer(model_dir: str | Path, *, mesh: DeviceMesh, device: torch.device, dtype: str, trainable: bool,
                 chunk_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 activation_checkpointing: bool = False, shard: bool = True) -> TokenScorer:
    """A `TokenScorer` over the HF model in `model_dir`, FSDP2-sharded over `mesh` when `shard`.

    temperature, top_p, top_k: the sampling distribution its log-probs are taken under (vLLM's
    processed log-probs: temperature, then top-k, then top-p; `learner.logprobs`); the defaults are the
    plain model distribution (top_k 0 or -1 = off, top_p 1 = off).
    trainable: fp32 parameters (+ bf16 compute when dtype='bfloat16': FSDP's MixedPrecisionPolicy, or
    autocast for an unsharded model), train mode; else frozen parameters in `dtype`, no gradients.
    shard=False (the learner's default for a world of one rank) keeps a plain module on the mesh's
    device: FSDP2 with one rank only adds buffer copies and hooks (≈10% of a tiny model's step).
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    compute = DTYPES[dtype]
    lm = load_causal_lm(model_dir, torch.float32 if trainable else compute)
    if activation_checkpointing and trainable:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mixed = trainable and compute != torch.float32
    scorer = TokenScorer(lm, temperature=temperature, top_p=top_p, top_k=top_k, chunk_tokens=chunk_tokens,
                         autocast_dtype=compute if mixed and not shard else None)
    if shard:
        kwargs: dict = {"mesh": mesh}
        if mixed:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        for layer in decoder_layers(lm):
            fully_shard(layer, **kwargs)
        fully_shard(scorer, **kwargs)
    else:
        scorer.to(device)
    scorer.train(trainable)
    if not trainable:
        for p in scorer.parameters():
            p.requires_grad_(False)
    return scorer


def make_mesh(device: torch.device, world_size: int) -> DeviceMesh:
    return init_device_mesh(device.type, (world_size,))


def ensure_sharded(module: nn.Module) -> None:
    """Put a root FSDP module back into its sharded state.

    FSDP2 does not reshard the root unit after a forward (its parameters would be gathered again for
    backward); after a no-grad forward the root's parameters stay unsharded — memory held for nothing,
    and `named_parameters()` then yields plain tensors instead of the DTensor parameters the optimiser
    holds. Call this after no-grad passes and before walking parameters.
    """
    if isinstance(module, FSDPModule):
        module.reshard()


def named_full_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) per unique parameter; a collective: every rank must iterate it fully."""
    ensure_sharded(module)
    for name, p in module.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        yield hf_name(name), full.detach()


def full_state_on_rank0(module: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """All parameters as full CPU tensors on rank 0 ({} elsewhere); every rank must call it."""
    out = {}
    for name, t in named_full_tensors(module):
        if rank == 0:
            out[name] = t.to("cpu", copy=True).contiguous()
    return out


@torch.no_grad()
def load_full_state(module: nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    """Copy full tensors (keyed by HF name, every rank holds them) into the sharded parameters."""
    ensure_sharded(module)
    missing = [hf_name(n) for n, _ in module.named_parameters() if hf_name(n) not in tensors]
    if missing:
        raise KeyError(f"{what} lacks parameters {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, p in module.named_parameters():
        src = tensors[hf_name(name)]
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError(f"{what}: {hf_name(name)} has shape {tuple(src.shape)}, the model {tuple(p.shape)}")
        copy_full_into(p, src)


def copy_full_into(p: torch.Tensor, full: torch.Tensor) -> None:
    """Write a full tensor into a (possibly sharded) parameter or state tensor, in place."""
    if isinstance(p, DTensor):
        local = distribute_tensor(full.to(p.device, p.dtype), p.device_mesh, p.placements, src_data_rank=None)
        p.to_local().copy_(local.to_local())
    else:
        p.copy_(full.to(p.device, p.dtype))
