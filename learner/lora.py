"""LoRA on the policy (`model.lora`): peft adapters on a frozen base, sharded with the base by FSDP2.

The pieces that build the model live in `learner.fsdp` (`attach`, `init_adapters`, the naming rules), which
builds it; this module has what uses it: the merged weights of a push, the reference, the exports.

Why it looks like this:
- `attach` wraps the HF model in peft's `PeftModel` while it is still on the meta device, before FSDP2
  shards it, so each adapter's A and B land in the FSDP unit of the decoder block whose linear layer they
  adapt (gathered and freed with it). peft freezes every base parameter; only A and B train, so the
  optimiser and its state hold the adapters only.
- Materialised shards are garbage: the base is read from the model directory, and the adapters are
  initialised (`init_adapters`) as peft does by default, A kaiming-uniform (a = √5, the
  rule of nn.Linear) and B zero, so step 0's policy is the base model exactly. A's values are drawn whole
  from a generator seeded by the run's seed and the parameter's name, and each rank keeps its rows: the
  start is the same for any number of ranks.
- Names: the parameters of a wrapped model are called `base_model.model.<HF name>` and the frozen weight of
  an adapted layer `<layer>.base_layer.weight`; `learner.fsdp.hf_name` removes the first prefix, so the base
  is read from the checkpoint under `<layer>.base_layer.weight` → `base_name` gives the HF name back.
  Adapter tensors are `<layer>.lora_A.default.weight` / `lora_B`; `peft_name` gives the names peft writes
  in adapter_model.safetensors (`base_model.model.<layer>.lora_A.weight`).
- The reference policy (`AdapterOff`) is the same module with its adapters switched off (peft's
  `disable_adapter`): no second copy of the base in memory.
- A weight push sends the adapter alone (`adapter_weights`, `model.lora.sync: adapter`, the default): the
  engines serve it through vLLM's LoRA support, a new adapter per version, each request pinned to the one it
  started with (`actors.adapters`). With `sync: merged` it sends the base with the adapter merged in
  (`merge_adapters`: W + (alpha/rank)·B·A per adapted layer, in fp32, then cast), and the engines serve one
  plain model per version exactly as in a full-parameter run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from learner.fsdp import ADAPTER, base_name, hf_name, is_adapter, peft_config, weight_files

_A, _B, _BASE = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight", ".base_layer."


def peft_name(hf: str) -> str:
    """The name peft saves an adapter tensor under (adapter_model.safetensors) for its HF-side name."""
    return "base_model.model." + hf.replace(f".{ADAPTER}.weight", ".weight")


def merge_adapters(named: Iterable[tuple[str, torch.Tensor]], scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs with every adapted layer's weight merged: W + scale·B·A under `<layer>.weight`,
    computed in fp32 and cast to W's dtype; the adapter tensors themselves are not yielded. `named` must give
    a layer's base weight, A and B in that order (peft registers them so), each a new tensor."""
    pending: dict[str, torch.Tensor] = {}
    for name, t in named:
        if _BASE in name and name.endswith(".weight"):
            pending[name.split(_BASE)[0]] = t
        elif name.endswith(_A):
            pending[name[: -len(_A)] + "#A"] = t
        elif name.endswith(_B):
            layer = name[: -len(_B)]
            w, a = pending.pop(layer), pending.pop(layer + "#A")
            merged = torch.addmm(w.float(), t.float(), a.float(), alpha=scale)  # a new tensor, never W itself
            yield layer + ".weight", merged.to(w.dtype)
        else:
            yield base_name(name), t
    if pending:
        raise RuntimeError(f"adapted layers without their adapters in the weight stream: {sorted(pending)[:3]}")


def adapter_weights(policy: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The push of an adapter-synced run (`model.lora.sync: adapter`): (peft name, full tensor in `dtype`, a
    new one) per adapter tensor, gathered one at a time (`full_tensor()` of its FSDP2 shard: a collective, so
    every rank iterates this in the same order); the frozen base is not gathered."""
    for name, p in policy.named_parameters():
        if is_adapter(name):
            full = p.full_tensor() if callable(getattr(p, "full_tensor", None)) else p
            yield peft_name(hf_name(name)), full.detach().to(dtype, copy=True)


def adapter_shapes(policy: nn.Module, dtype: torch.dtype) -> list[tuple[str, torch.Size, torch.dtype]]:
    """(peft name, full shape, `dtype`) of what `adapter_weights` yields, gathering nothing."""
    return [(peft_name(hf_name(n)), p.shape, dtype) for n, p in policy.named_parameters() if is_adapter(n)]


def serving_names(names: Iterable[tuple[str, torch.Size]]) -> list[tuple[str, torch.Size]]:
    """(HF name, shape) of what `merge_adapters` yields for parameters (name, shape)."""
    return [(base_name(n), s) for n, s in names if not is_adapter(n)]


class AdapterOff:
    """The reference policy of a LoRA run: the policy's own forward with its adapters switched off (peft's
    `disable_adapter`) and, like every auxiliary model, the untruncated sampling distribution (top-p and
    top-k off; `learner.learner.Learner.build_model`). Callable like a `TokenScorer`, without gradients."""

    def __init__(self, policy: nn.Module):
        self.policy = policy

    def __call__(self, **inputs):
        p = self.policy
        truncation = (p.top_p, p.top_k)
        with torch.no_grad(), p.lm.disable_adapter(), _restore(p, truncation):
            p.top_p, p.top_k = 1.0, 0
            return p(**inputs)


@contextlib.contextmanager
def _restore(policy: nn.Module, truncation: tuple[float, int]):
    try:
        yield
    finally:
        policy.top_p, policy.top_k = truncation


# ---------------------------------------------------------------------- checkpoints and exports
ADAPTER_CONFIG = "adapter_config.json"  # peft's file name; a checkpoint holding it is a LoRA policy's
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def save_adapter_config(directory: Path, lora, model_dir: Path) -> None:
    """peft's adapter_config.json of the policy into a checkpoint `directory` (rank 0); it names the absolute
    base model directory, which exports read the frozen weights from."""
    peft_config(lora, str(Path(model_dir).resolve())).save_pretrained(str(directory))


def export_adapter(checkpoint: Path, out: Path, dtype: torch.dtype, merged: bool,
                   tensors: dict[str, torch.Tensor]) -> Path:
    """Write a LoRA checkpoint's policy to `out` (replaced atomically): the adapter in peft's format
    (adapter_config.json, adapter_model.safetensors in `dtype`) and the tokenizer files, so peft's
    `PeftModel.from_pretrained(base, out)` and vLLM's `LoRARequest(..., out)` load it; with `merged`, also
    `out/merged/`: a plain HF model, the base with W + scale·B·A in every adapted layer (`dtype`). tensors: the
    checkpoint's policy tensors ("model.<fqn>", `learner.checkpoint.read_model_tensors`)."""
    config = json.loads((checkpoint / ADAPTER_CONFIG).read_text())
    scale = float(config["lora_alpha"]) / float(config["r"])
    adapters = {hf_name(k.removeprefix("model.")): v for k, v in tensors.items()}
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint / "hf_config", tmp)
    if merged:
        _export_merged(Path(config["base_model_name_or_path"]), adapters, scale, dtype, tmp / "merged", tmp)
    (tmp / "config.json").unlink()  # the base's: an adapter directory is not a model (vLLM and peft read the base's)
    shutil.copyfile(checkpoint / ADAPTER_CONFIG, tmp / ADAPTER_CONFIG)
    save_file({peft_name(k): v.to(dtype).contiguous() for k, v in adapters.items()}, str(tmp / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def _export_merged(base: Path, adapters: dict[str, torch.Tensor], scale: float, dtype: torch.dtype, out: Path,
                   hf_config: Path) -> None:
    """The base model of `base` with `adapters` merged, as one safetensors file per base weights file (each
    read one tensor at a time), plus the config (dtype `dtype`) and tokenizer files of `hf_config`."""
    from safetensors import safe_open

    shutil.copytree(hf_config, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    files = weight_files(base)
    layers = {n[: -len(_A)] for n in adapters if n.endswith(_A)}
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    for f, names in by_file.items():
        tensors = {}
        with safe_open(f, framework="pt") as src:
            for name in names:
                w = src.get_tensor(name)
                layer = name.removesuffix(".weight")
                if layer in layers:
                    w = torch.addmm(w.float(), adapters[layer + _B].float(), adapters[layer + _A].float(), alpha=scale)
                tensors[name] = w.to(dtype).contiguous()
        save_file(tensors, str(out / f.name), metadata={"format": "pt"})
    if (base / "model.safetensors.index.json").is_file():
        shutil.copyfile(base / "model.safetensors.index.json", out / "model.safetensors.index.json")
    missing = layers - {n.removesuffix(".weight") for n in files}
    if missing:
        raise KeyError(f"{base}: the base model lacks the adapted layers {sorted(missing)[:3]}")
