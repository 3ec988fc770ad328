"""Before start: whether `model.lora` fits the model (`lora_problem`), read from its config alone (the model is
built on the meta device: no weights read, no memory).

Refused, each naming the fix:
- a target name that matches no nn.Linear of the model (peft's rule: the last part of a module's name);
- a target that matches the output head (its LoRA would be bypassed: the learner computes log-probs from the
  head's weight directly, `learner.logprobs`) — or a module that is not a linear layer;
- a rank larger than the smaller dimension of a targeted layer (B·A would then have no low rank to learn);
- a model class vLLM cannot serve adapters on (`actors.engine.lora_serving_problem`): the run's output is a
  peft adapter, which should load in vLLM beside its base.
"""

from __future__ import annotations

from pathlib import Path


def lora_problem(cfg, model_dir: Path | None) -> str | None:
    """The first problem of `cfg.model.lora` on the model of `model_dir` (None: the built-in tiny model, its
    shape from `model.tiny`), or None when LoRA is off or fits."""
    lora = cfg.model.lora
    if not lora.enabled:
        return None
    config = _config(cfg, model_dir)
    lm = _meta_model(config, cfg.model.trust_remote_code)
    head = lm.get_output_embeddings()
    found: dict[str, list[tuple[str, object]]] = {t: [] for t in lora.target_modules}
    for name, module in lm.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in found:
            found[last].append((name, module))
    import torch

    for target, modules in found.items():
        if not modules:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear)
                             and m is not head})
            return (f"model.lora.target_modules: {target!r} matches no layer of {type(lm).__name__} — choose among "
                    f"its linear layers: {', '.join(linear)}")
        for name, module in modules:
            if module is head or not isinstance(module, torch.nn.Linear):
                why = "the output head (its adapter would be bypassed: log-probs are computed from the head's weight)" \
                    if module is head else f"a {type(module).__name__}, not a linear layer"
                return f"model.lora.target_modules: {target!r} names {name}, {why} — remove it from the list"
            smallest = min(module.in_features, module.out_features)
            if lora.rank > smallest:
                return (f"model.lora.rank: {lora.rank} exceeds the smaller dimension of {name} "
                        f"({module.out_features} × {module.in_features}) — use at most {smallest}, or drop {target!r} "
                        "from model.lora.target_modules")
    from actors.engine import lora_serving_problem

    return lora_serving_problem(list(getattr(config, "architectures", None) or [type(lm).__name__]))


def _config(cfg, model_dir: Path | None):
    from transformers import AutoConfig, LlamaConfig

    if model_dir is not None:
        return AutoConfig.from_pretrained(model_dir, trust_remote_code=cfg.model.trust_remote_code)
    t = cfg.model.tiny  # tasks.tiny_model.build_tiny_model's architecture (its vocabulary does not matter here)
    return LlamaConfig(vocab_size=128, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                       num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_heads,
                       max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=True,
                       architectures=["LlamaForCausalLM"])


def _meta_model(config, trust_remote_code: bool):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
