"""The tiny default model: HF loading, the character tokenizer, idempotent builds, and a real vLLM."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.arithmetic import Problem
from tasks.tiny_model import build_tiny_model

TEXT = "7+6+0=13, 3\n\n5+8+1=14, 43\n\n4+3+1=8, 843\n\n\\boxed{843}"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def test_character_tokenizer_round_trips(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(TEXT)  # one token per character, "\n" included
    assert tokenizer.decode(ids) == TEXT  # joined without spaces
    assert tokenizer.decode(tokenizer("é")["input_ids"]) == "<unk>"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert len(tokenizer) == 7 + 95 + 1  # special tokens, printable ASCII, "\n"


def test_chat_template(tokenizer):
    p = Problem(457, "+", 386)
    chat = [{"role": "user", "content": p.prompt}]
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>What is 457+386?<|assistant|>"
    full = tokenizer.apply_chat_template(
        chat + [{"role": "assistant", "content": p.solution}], tokenize=False
    )
    assert full == prompt + p.solution + "</s>"
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert len(ids) == 3 + len(p.prompt) + len(p.solution) + 1  # <s> <|user|> ... <|assistant|> ... </s>
    assert tokenizer.decode(ids, skip_special_tokens=True) == p.prompt + p.solution


def test_hf_model_loads_and_is_the_documented_shape(tiny_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers) == (
        "llama",
        128,
        2,
        2,
    )
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # vLLM CPU attention needs head_dim 64
    assert cfg.vocab_size == len(tokenizer) and (tiny_dir / "model.safetensors").exists()
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, len(TEXT), len(tokenizer)) and torch.isfinite(logits).all()


def test_build_is_idempotent_and_refuses_to_overwrite(tiny_dir, tmp_path):
    stamp = os.stat(tiny_dir / "model.safetensors").st_mtime_ns
    t0 = time.perf_counter()
    assert build_tiny_model(tiny_dir, seed=0) == tiny_dir
    assert time.perf_counter() - t0 < 0.1
    assert os.stat(tiny_dir / "model.safetensors").st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="does not hold a tiny model built with"):
        build_tiny_model(tiny_dir, seed=1)
    # same seed, same weights
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_vllm_loads_generates_and_detokenizes(tiny_dir, tokenizer):
    pytest.importorskip("vllm")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7+6?\n\nThink."}], tokenize=False, add_generation_prompt=True
    )
    probe = Path(__file__).with_name("vllm_probe.py")
    proc = subprocess.run(
        [sys.executable, str(probe), str(tiny_dir), prompt, "float32"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("PROBE_RESULT "))

    assert result["prompt_token_ids"] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    mixed, newlines, _, free = result["outputs"]
    # detokenized text is the characters of the sampled ids, joined without spaces
    assert len(mixed["token_ids"]) == 40 and set(mixed["text"]) <= set("\n 7+={")
    assert mixed["text"] == "".join(tokenizer.convert_ids_to_tokens(mixed["token_ids"]))
    assert newlines["text"] == "\n\n\n\n"
    assert free["text"] == tokenizer.decode(free["token_ids"], skip_special_tokens=True)

    # vLLM and transformers compute the same log-probs from the same weights (float32 both)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    ids = torch.tensor([result["prompt_token_ids"]])
    with torch.no_grad():
        hf = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert result["prompt_logprobs"][0] is None
    torch.testing.assert_close(torch.tensor(result["prompt_logprobs"][1:]), hf, atol=1e-3, rtol=1e-3)
    # the behaviour log-probs actors will store are real numbers
    assert all(lp <= 0 for lp in mixed["logprobs"]) and len(mixed["logprobs"]) == 40
