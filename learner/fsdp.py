"""Loading an HF causal LM and sharding it with FSDP2 (`fully_shard`); full fp32 weights.

Why:
- Every decoder block is its own FSDP unit (its parameters are all-gathered just before it runs and
  freed after), and the `TokenScorer` wrapper is the root unit: embeddings, final norm and LM head
  are gathered for the whole forward, which covers the chunked log-prob head (`learner.logprobs`).
- bf16 training keeps fp32 master weights and optimiser state; `MixedPrecisionPolicy` casts the
  gathered parameters to bf16 for compute and reduces gradients in fp32. Frozen models (reference,
  scorers) are simply loaded in the compute dtype, and sharded the same way (`shard_frozen` for PURE's PRM).
- Loading never holds a full copy of the model per rank: the model is built on the meta device from
  its config, sharded, materialised (each rank allocates only its shards), and each rank reads only
  its own rows of every tensor from the safetensors files (`load_local_weights`, one tensor open at a
  time). Non-persistent buffers (rotary `inv_freq`), absent from checkpoints, are recomputed by HF's
  own initialiser (`init_buffers`); tied embeddings stay one parameter. bench/perf/load_memory.py
  measures the peak host RAM per rank (bench/RESULTS.md).
- Dropout is switched off (π_prox, recomputed without grad, must equal π_θ at the start of a step).
- A world of one rank keeps the plain module by default (`shard=False`; bf16 via autocast): FSDP2
  with a single rank only adds buffer copies and hooks (bench/RESULTS.md).
- Full fp32 weights can be produced parameter by parameter (`named_full_tensors`, one `full_tensor()`
  each, a collective every rank joins); tied parameters appear once, under the name
  `named_parameters` gives them (HF re-ties them on load). The weight push gathers in the serving
  dtype one FSDP unit at a time instead (`learner.gather`); checkpoints are sharded
  (`learner.checkpoint`).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from learner.logprobs import TokenScorer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PREFIX = "lm."
PEFT_PREFIX = "base_model.model."  # what peft's PeftModel puts before the HF names (learner.lora)
ADAPTER = "default"  # peft's adapter name: the only adapter of a LoRA policy


def hf_name(name: str) -> str:
    """HF parameter name of a `TokenScorer` parameter (wrapper prefixes removed)."""
    for p in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(p, "")
    name = name[len(PREFIX):] if name.startswith(PREFIX) else name
    return name.removeprefix(PEFT_PREFIX)  # a LoRA policy's wrapper (learner.lora)


def _model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not an HF model directory (no config.json)")
    return path


def load_causal_lm(model_dir: str | Path, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
    """A plain HF causal LM loaded whole by `from_pretrained` (tests, the actors' checks)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(_model_dir(model_dir), dtype=dtype, attn_implementation="sdpa",
                                              trust_remote_code=trust_remote_code)
    disable_dropout(lm)
    return lm


def empty_causal_lm(model_dir: str | Path, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
    """The HF causal LM of `model_dir` built from its config on the meta device (no memory, no init).
    trust_remote_code (model.trust_remote_code): a directory whose config names its own modelling code."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = _model_dir(model_dir)
    with torch.device("meta"):
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa",
                                              trust_remote_code=trust_remote_code)
    if (path / "generation_config.json").is_file():
        lm.generation_config = GenerationConfig.from_pretrained(path)
    disable_dropout(lm)
    return lm


@torch.no_grad()
def init_buffers(lm: nn.Module) -> None:
    """Recompute the non-persistent buffers (rotary `inv_freq`, ...) of a materialised meta-built HF
    model with HF's own initialiser (checkpoints do not hold them). Floating buffers are NaN-filled
    first, so one the initialiser does not know fails here instead of silently holding garbage."""
    for name, m in lm.named_modules():
        names = [b for b in m._non_persistent_buffers_set if m._buffers.get(b) is not None]
        if not names:
            continue
        for b in names:
            if m._buffers[b].is_floating_point():
                m._buffers[b].fill_(float("nan"))
        lm._init_weights(m)
        bad = [b for b in names if m._buffers[b].is_floating_point() and not m._buffers[b].isfinite().all()]
        if bad:
            raise RuntimeError(f"{type(lm).__name__}: cannot initialise buffers {bad} of {name or 'the model'} after "
                               "building on the meta device (its _init_weights does not set them)")


def weight_files(model_dir: Path) -> dict[str, Path]:
    """{tensor name: safetensors file holding it} of an HF model directory (single file or sharded index)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return {k: model_dir / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{model_dir} holds no safetensors weights (model.safetensors or "
                                "model.safetensors.index.json); convert it with save_pretrained(safe_serialization=True)")
    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def persistent_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """{HF name: tensor} of what a checkpoint holds: parameters (tied ones once) and persistent buffers."""
    out = {hf_name(n): p for n, p in module.named_parameters()}
    for prefix, m in module.named_modules():
        for b, t in m._buffers.items():
            if t is not None and b not in m._non_persistent_buffers_set:
                out[hf_name(f"{prefix}.{b}" if prefix else b)] = t
    return out


def shard_start(p: DTensor) -> int:
    """First global row of this rank's shard of an FSDP2 parameter. FSDP2 shards dim 0 like
    `torch.chunk`: ceil(rows / world) rows per rank, the last ranks shorter or empty."""
    if tuple(p.placements) != (Shard(0),):
        raise ValueError(f"expected an FSDP2 parameter sharded on dim 0, got placements {p.placements}")
    per_rank = -(-p.shape[0] // p.device_mesh.size())
    return min(p.device_mesh.get_local_rank() * per_rank, p.shape[0])


@torch.no_grad()
def load_local_weights(module: nn.Module, model_dir: str | Path) -> None:
    """Fill a materialised (possibly FSDP2-sharded) model from the safetensors files of `model_dir`: each
    rank reads only its own rows of every sharded tensor (whole tensors otherwise), one tensor at a time
    (the file is opened per tensor, so no mapped pages pile up), cast to the parameter's dtype."""
    files = weight_files(Path(model_dir))
    # a LoRA policy: adapters are initialised, not read (learner.lora); an adapted layer's frozen weight is
    # <layer>.base_layer.weight in the module, <layer>.weight in the files
    state = {base_name(n): t for n, t in persistent_state(module).items() if not is_adapter(n)}
    missing = [n for n in state if n not in files]
    if missing:
        raise KeyError(f"{model_dir}: the checkpoint lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, t in state.items():
        with safe_open(files[name], framework="pt") as f:
            src = f.get_slice(name)
            if tuple(src.get_shape()) != tuple(t.shape):
                raise ValueError(f"{model_dir}: {name} has shape {tuple(src.get_shape())}, the model {tuple(t.shape)}")
            if isinstance(t, DTensor):
                local = t.to_local()
                start = shard_start(t)
                local.copy_(src[start:start + local.shape[0]])
            else:
                t.copy_(f.get_tensor(name))


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
                 chunk_tokens: int | str, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 activation_checkpointing: bool = False, shard: bool = True,
                 trust_remote_code: bool = False, lora=None, seed: int = 0) -> TokenScorer:
    """A `TokenScorer` over the HF model in `model_dir`, FSDP2-sharded over `mesh` when `shard`.

    temperature, top_p, top_k: the sampling distribution its log-probs are taken under (vLLM's
    processed log-probs: temperature, then top-k, then top-p; `learner.logprobs`); the defaults are the
    plain model distribution (top_k 0 or -1 = off, top_p 1 = off).
    trainable: fp32 parameters (+ bf16 compute when dtype='bfloat16': FSDP's MixedPrecisionPolicy, or
    autocast for an unsharded model), train mode; else frozen parameters in `dtype`, no gradients.
    shard=False (the learner's default for a world of one rank) keeps a plain module on `device`:
    FSDP2 with one rank only adds buffer copies and hooks (≈10% of a tiny model's step).
    Built on the meta device, then each rank materialises and reads only its shards (module doc).
    chunk_tokens "auto" (learner.logprob_chunk_tokens of a config the launch did not resolve): by `device`,
    `LearnerConfig.resolved_logprob_chunk_tokens`.
    lora: a `configs.lora_section.LoraConfig` with rank > 0 (the policy of a LoRA run, `learner.lora`): the base
    frozen, adapters attached before sharding and initialised from `seed`; None = every weight trains.
    """
    if chunk_tokens == "auto":
        from configs.shared import LearnerConfig

        chunk_tokens = LearnerConfig(logprob_chunk_tokens="auto").resolved_logprob_chunk_tokens(device.type == "cuda")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    compute = DTYPES[dtype]
    lm = empty_causal_lm(model_dir, torch.float32 if trainable else compute, trust_remote_code)
    if activation_checkpointing and trainable:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None:
        lm = attach(lm, lora)
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
    scorer.to_empty(device=device)  # this rank's shards only
    if not shard:
        lm.tie_weights()  # to_empty gives each module its own new tensor
    init_buffers(lm)
    load_local_weights(scorer, model_dir)
    if lora is not None:
        init_adapters(scorer, seed)
    scorer.train(trainable)
    if not trainable:
        for p in scorer.parameters():
            p.requires_grad_(False)
    return scorer


def shard_frozen(module: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2-shard a frozen model (PURE's PRM) over `mesh` as `build_scorer` shards the reference: each
    decoder block a unit of its own (gathered just before it runs, freed after), the rest (embedding,
    final norm, head) the root unit; parameters stay in their dtype (no mixed precision: nothing trains)."""
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)


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


# ---------------------------------------------------------------------- LoRA adapters (learner.lora says why)
def peft_config(lora, base_model: str | None = None):
    """peft's LoraConfig of `lora` (a `configs.lora_section.LoraConfig`)."""
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.scale * lora.rank, target_modules=list(lora.target_modules),
                      lora_dropout=lora.dropout, bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_model)


def attach(lm: nn.Module, lora) -> nn.Module:
    """`lm` (on the meta device) wrapped in a peft model with one adapter per targeted linear layer; the base
    frozen. Raises ValueError naming the fix when a target matches no layer."""
    from peft import get_peft_model

    try:
        return get_peft_model(lm, peft_config(lora))
    except ValueError as e:
        raise ValueError(f"model.lora.target_modules {list(lora.target_modules)}: {e}") from None


def is_adapter(name: str) -> bool:
    """Whether a parameter (any naming) is an adapter tensor (A or B)."""
    return ".lora_A." in name or ".lora_B." in name


def base_name(name: str) -> str:
    """The HF name of a frozen weight of an adapted layer (`<layer>.base_layer.weight` → `<layer>.weight`)."""
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def init_adapters(module: nn.Module, seed: int) -> None:
    """peft's default start on materialised (possibly FSDP2-sharded) adapters: B = 0; A kaiming-uniform with
    a = √5 (bound = 1/√in), drawn whole from a generator seeded by (seed, name) so every world size starts
    the same, each rank keeping its own rows (module docstring)."""
    for name, p in module.named_parameters():
        if ".lora_B." in name:
            p.zero_()
        elif ".lora_A." in name:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.empty(p.shape, dtype=torch.float32)
            nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=gen)
            local = p.to_local() if isinstance(p, DTensor) else p
            start = shard_start(p) if isinstance(p, DTensor) else 0
            local.copy_(full[start:start + local.shape[0]].to(local.device, local.dtype))
