"""How a prompt becomes tokens (`data.system_prompt`, `data.chat_template`, `data.prompt_format`): the run's
driver (`load_run_data`, whose ids the actors generate from and the learner trains on) and `algo-train eval`
(`eval_items`) give the same ids, checked on the built-in tiny model's tokenizer, whose chat template is
``<s>`` then ``<|system|>…`` / ``<|user|>…`` per message and ``<|assistant|>`` to generate."""

import json
from pathlib import Path

import pytest

from configs.loading import ConfigError, dump_annotated, resolve
from configs.schema import RunConfig
from launch.commands.evaluate import eval_items
from launch.prep.data import load_run_data
from launch.prep.preflight import PreflightError, preflight
from launch.state.storage import absolutize
from tasks.tiny_model import build_tokenizer

QUESTION = "What is 2+3?"


def data_file(path: Path, prompts: list) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "5"}) + "\n" for p in prompts))
    return path


def tokenizer_dir(path: Path, chat_template: bool = True) -> Path:
    """A model directory as preflight and the loaders read it (config, tokenizer; weights are never read)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"")
    tok = build_tokenizer()
    if not chat_template:
        tok.chat_template = None
    tok.save_pretrained(path)
    return path


def rendered(tmp_path: Path, prompts: list, **data) -> tuple[list[str], list[str]]:
    """The decoded prompt ids of the training set and of `algo-train eval` on the same file."""
    tok = build_tokenizer()
    tmp_path.mkdir(exist_ok=True)
    path = data_file(tmp_path / "d.jsonl", [*prompts, "padding row for the held-out split"])
    cfg = RunConfig(model={"path": str(tokenizer_dir(tmp_path / "m"))},
                    data={"task": "file", "path": str(path), "eval_prompts": 1, **data})
    run = load_run_data(cfg, tok, tmp_path, need_demos=False, log=lambda _: None)
    evaluated, _, _ = eval_items(cfg, limit=len(prompts), log=lambda _: None)
    assert [it.prompt_ids for it in evaluated] == [it.prompt_ids for it in run.train]  # eval sees the run's tokens
    return [tok.decode(it.prompt_ids) for it in run.train], [it.question for it in run.train]


def test_the_system_prompt_is_in_every_prompts_tokens(tmp_path):
    own = [{"role": "system", "content": "Use words."}, {"role": "user", "content": "What is 1+1?"}]
    texts, questions = rendered(tmp_path, [QUESTION, own], system_prompt="Put the answer in \\boxed{}.")
    assert texts == ["<s><|system|>Put the answer in \\boxed{}.<|user|>What is 2+3?<|assistant|>",
                     "<s><|system|>Use words.<|user|>What is 1+1?<|assistant|>"]  # a row's own system message stays
    assert questions == [QUESTION, "What is 1+1?"]  # the reward still gets the question alone


def test_raw_prompts_use_no_template(tmp_path):
    texts, _ = rendered(tmp_path, [QUESTION], prompt_format="raw", system_prompt="Answer briefly.")
    assert texts == ["Answer briefly.\n\nWhat is 2+3?"]  # no <s>, <|user|>, <|assistant|>: the text as is
    # a base model without a chat template is fine in raw mode, and refused in chat mode with both fixes
    bare = tokenizer_dir(tmp_path / "base", chat_template=False)
    path = str(data_file(tmp_path / "p.jsonl", [QUESTION] * 3))
    preflight(RunConfig(model={"path": str(bare)}, data={"task": "file", "path": path, "eval_prompts": 1,
                                                         "prompt_format": "raw"}))
    with pytest.raises(PreflightError) as err:
        preflight(RunConfig(model={"path": str(bare)}, data={"task": "file", "path": path, "eval_prompts": 1}))
    assert str(err.value) == (f"model.path: the tokenizer in {bare} has no chat template (prompts are chat-formatted) "
                              "— give one with data.chat_template, or use data.prompt_format=raw for a base model")


def test_a_chat_template_override_is_used_as_text_or_file(tmp_path):
    template = "{{ bos_token }}Q: {{ messages[-1]['content'] }}\nA:"
    texts, _ = rendered(tmp_path / "text", [QUESTION], chat_template=template)
    assert texts == ["<s>Q: What is 2+3?\nA:"]
    (tmp_path / "file").mkdir()
    (tmp_path / "file" / "qa.jinja").write_text(template)
    cfg = absolutize(RunConfig(data={"chat_template": "qa.jinja"}), tmp_path / "file")
    assert cfg.data.chat_template == str(tmp_path / "file" / "qa.jinja")  # a file is a path: absolute
    assert absolutize(RunConfig(data={"chat_template": template}), tmp_path).data.chat_template == template
    texts, _ = rendered(tmp_path / "file", [QUESTION], chat_template=cfg.data.chat_template)
    assert texts == ["<s>Q: What is 2+3?\nA:"]


def test_template_mistakes_are_refused_before_start(tmp_path):
    path = str(data_file(tmp_path / "p.jsonl", [QUESTION] * 3))

    def problem(**data) -> str:
        with pytest.raises(PreflightError) as err:
            preflight(RunConfig(data={"task": "file", "path": path, "eval_prompts": 1, **data}))
        return str(err.value)

    assert problem(chat_template="{{ raise_exception('user messages only') }}") == (
        "data.chat_template: the chat template fails on the first training prompt (user messages only) — fix the "
        "template, or give one with data.chat_template")
    assert problem(chat_template=str(tmp_path / "absent.jinja")).startswith(
        f"data.chat_template: cannot read {tmp_path}/absent.jinja (No such file or directory) — give an existing "
        ".jinja file or the template text")
    with pytest.raises(ConfigError, match="data.chat_template: set, but data.prompt_format=raw uses no template"):
        resolve("grpo", overrides=["data.prompt_format=raw", "data.chat_template={{ x }}"])
    with pytest.raises(ConfigError, match="data.chat_template: 'qa.txt' is neither a .jinja file nor Jinja template"):
        resolve("grpo", overrides=["data.chat_template=qa.txt"])


def test_the_new_keys_show_in_dry_run():
    dump = dump_annotated(resolve("grpo"))
    for line in ("  prompt_format: chat  # chat = a prompt's messages go through the chat template",
                 "  system_prompt: null  # text put before every prompt as a system message",
                 "  chat_template: null  # Jinja chat template used instead of the tokenizer's",
                 "  split: train  # split of a Hub dataset (hf://)", "  eval_split: test  # split of a Hub dataset",
                 "  trust_remote_code: false  # let transformers and vLLM run the Python code"):
        assert line in dump
