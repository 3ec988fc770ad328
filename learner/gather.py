"""The policy's weights in the serving dtype, for the weight sync: one FSDP unit gathered at a time.

Why: the engines serve `model.dtype` (bf16 on GPUs), so that is what should travel, and gathering a
whole FSDP unit (`FSDPModule.unshard()`: one all-gather per decoder block) beats one `full_tensor()`
per parameter (about ten per block). Under a bf16 `MixedPrecisionPolicy` the unsharded parameters
are already bf16 (the all-gather moves half the bytes of fp32) and equal the fp32 masters cast to bf16
bit for bit: the cast is elementwise, so casting the shards and gathering them is gathering and
casting.

Rules:
- Order: the decoder blocks (the FSDP units below the root, in module order), then the root's own
  parameters (embeddings, final norm, LM head); tied parameters once, under their first name. Names are
  the HF names vLLM loads (`learner.fsdp.hf_name`).
- Every tensor yielded is a new tensor, never a view of a live parameter: a push may travel in the
  background while the optimiser updates the parameters (`weightsync.sender`: prepare, then send).
- A collective: every rank must iterate it to the end, in the same order.
- The gathered values are used only when they are exact: gathered in `dtype` (the mixed-precision
  cast is the wanted cast) or in the masters' dtype (then cast here). Asking for more precision than
  the policy gathers (fp32 from a bf16 policy) is an error; the fp32 masters come from
  `learner.fsdp.named_full_tensors`.
An unsharded module (a world of one rank) yields cast copies of its parameters.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from learner.fsdp import base_name, ensure_sharded, hf_name, is_adapter


def serving_weights(policy: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, new tensor in `dtype`) per unique parameter of `policy`, one FSDP unit at a time."""
    if not isinstance(policy, FSDPModule):
        for name, p in policy.named_parameters():
            yield hf_name(name), p.detach().to(dtype, copy=True)
        return
    ensure_sharded(policy)
    units = [(f"{n}.", m) for n, m in policy.named_modules() if isinstance(m, FSDPModule) and m is not policy]
    for prefix, unit in [*units, ("", policy)]:
        yield from _unit_weights(unit, prefix, dtype)


def serving_shapes(policy: nn.Module, dtype: torch.dtype) -> list[tuple[str, torch.Size, torch.dtype]]:
    """(HF name, full shape, `dtype`) of each tensor `serving_weights(policy, dtype)` yields, gathering
    nothing (a DTensor's shape is the full one): what rank 0's weight sender reserves host memory for
    before the first push (`weightsync.sender.WeightSender.reserve_staging`)."""
    return [(base_name(hf_name(name)), p.shape, dtype) for name, p in policy.named_parameters()
            if not is_adapter(name)]  # a LoRA policy pushes its base with the adapters merged (learner.lora)


def _own_parameters(unit: nn.Module, prefix: str) -> list[tuple[str, nn.Parameter]]:
    """The parameters `unit`'s FSDP group manages: those not under a nested FSDP unit."""
    nested = tuple(f"{n}." for n, m in unit.named_modules() if m is not unit and isinstance(m, FSDPModule))
    return [(prefix + n, p) for n, p in unit.named_parameters() if not n.startswith(nested)]


def _unit_weights(unit: FSDPModule, prefix: str, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    masters = {n: p.dtype for n, p in _own_parameters(unit, prefix)}
    unit.unshard()
    try:
        for name, p in _own_parameters(unit, prefix):
            if p.dtype not in (dtype, masters[name]):
                raise ValueError(f"{hf_name(name)}: FSDP gathers {p.dtype} (MixedPrecisionPolicy), which cannot "
                                 f"give exact {dtype} values; serve the compute dtype (model.dtype)")
            yield hf_name(name), p.detach().to(dtype, copy=True)
    finally:
        unit.reshard()
