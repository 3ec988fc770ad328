"""Assets of the real-tokenizer end-to-end runs, built locally in seconds (nothing is downloaded): what a
user brings to `algo-train --model DIR --data FILE`, shaped like a real one.

- a byte-level BPE tokenizer trained with `tokenizers` on MATH-500's problems and solutions (the file
  the runs train on), Qwen's chat format: ``<|im_start|>user\\n{problem}<|im_end|>\\n<|im_start|>assistant\\n``,
  eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos;
- a random-init `Qwen2ForCausalLM`: hidden 128 = 2 query heads × head_dim 64 (vLLM's CPU attention
  needs 64), one key/value head (grouped-query attention, as Qwen2 models have), q/k/v biases, tied
  embeddings, float32 safetensors;
- a random-init `Qwen2ForTokenClassification` with 2 labels and the same tokenizer: PURE's HF PRM
  (`learner.prm.pure.HFTokenClassificationPRM`: "\\n", its step tag, is one byte-level token).

Why random weights: the runs check that every algorithm trains end to end on a real architecture, a
real tokenizer and real data with math-verify rewards, not that it learns. Such a model scores 0, so
its groups are all-fail: the runs keep them (`buffer.acc_lo=0.0` where a window filter is on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MATH500 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 3000
MAX_POSITIONS = 4096  # a LUFFY ρ = 1 row is the prompt + a whole MATH solution (no response budget)


@dataclass(frozen=True)
class RealAssets:
    model: Path  # Qwen2ForCausalLM + tokenizer
    prm: Path  # Qwen2ForTokenClassification (2 labels) + the same tokenizer
    data: Path  # MATH-500 as shipped (problem/answer/solution): --data and LUFFY's --demos


def math_texts(path: Path = MATH500) -> list[str]:
    """Every problem and solution of the MATH-500 file (the tokenizer's training text)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r[k] for r in rows for k in ("problem", "solution")]


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE `PreTrainedTokenizerFast` of `vocab_size` tokens (special tokens included)
    trained on `texts`, with the chat template above. Every byte is in the initial alphabet, so any
    text encodes and decodes losslessly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], clean_up_tokenization_spaces=False,
                                   model_max_length=MAX_POSITIONS, chat_template=CHAT_TEMPLATE)


def qwen2_config(tokenizer, num_labels: int | None = None):
    """The small Qwen2 shape of the module docstring for `tokenizer`'s vocabulary."""
    from transformers import Qwen2Config

    extra = {"num_labels": num_labels} if num_labels else {}
    return Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=MAX_POSITIONS,
                       tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **extra)


def build_real_assets(out: Path, data: Path = MATH500, seed: int = 0) -> RealAssets:
    """Write the tokenizer, the policy and the PRM under `out` (module docstring); `data` is used as is."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM, Qwen2ForTokenClassification

    tokenizer = train_tokenizer(math_texts(data))
    assets = RealAssets(model=out / "qwen2-bpe", prm=out / "qwen2-prm", data=data)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        policy = Qwen2ForCausalLM(qwen2_config(tokenizer))
        prm = Qwen2ForTokenClassification(qwen2_config(tokenizer, num_labels=2))
    policy.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                                pad_token_id=tokenizer.pad_token_id)
    for model, where in ((policy, assets.model), (prm, assets.prm)):
        model.save_pretrained(where, safe_serialization=True)
        tokenizer.save_pretrained(where)
    return assets
