"""The teacher of `--algo opd` is checked before anything starts (`launch.prep.preflight.check_teacher`): it
must be named, load, and share the student's tokenizer; each refusal is one line naming teacher.path, what
differs and the fix."""

import json
from pathlib import Path

import pytest

from configs.schema import RunConfig
from launch.prep.preflight import PreflightError, preflight
from launch.prep.teacher_check import FIX
from tasks.tiny_model import build_tokenizer


def teacher_dir(path: Path, tok=None, config: dict | None = None) -> Path:
    """An HF directory with the built-in model's tokenizer (or `tok`) and a readable llama config."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config or {"model_type": "llama", "vocab_size": 103}))
    (path / "model.safetensors").write_bytes(b"")
    (tok or build_tokenizer()).save_pretrained(path)
    return path


def opd(teacher, **sections) -> RunConfig:
    return RunConfig.model_validate({"algo": "opd", "teacher": {"path": None if teacher is None else str(teacher)},
                                     **sections})


def problem(cfg: RunConfig) -> str:
    with pytest.raises(PreflightError) as err:
        preflight(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_teacher_with_the_students_tokenizer_passes(tmp_path):
    assert preflight(opd(teacher_dir(tmp_path / "t"))) is None


def test_a_missing_or_unloadable_teacher_is_refused(tmp_path):
    assert problem(opd(None)) == ("teacher.path: --algo opd distills from a teacher and none is named — set "
                                  "teacher.path to a local HF model directory or a Hub id in the local HF cache "
                                  "(--set teacher.path=DIR)")
    fix = ("teacher.path must be a local HF model directory (config.json, tokenizer and weights, as save_pretrained "
           "writes)")
    assert problem(opd(tmp_path / "absent")) == f"teacher.path: {tmp_path}/absent is not a directory — {fix}"
    light = teacher_dir(tmp_path / "light")
    (light / "model.safetensors").unlink()
    assert problem(opd(light)) == f"teacher.path: {light} holds no weights (*.safetensors or *.bin) — {fix}"
    alien = teacher_dir(tmp_path / "alien", config={"model_type": "no-such-architecture"})
    assert problem(opd(alien)).startswith(f"teacher.path: transformers cannot read the model config in {alien} (")
    small = teacher_dir(tmp_path / "small", config={"model_type": "llama", "vocab_size": 50})
    assert problem(opd(small)) == ("teacher.path: the teacher's model has 50 logits (config.json vocab_size) but the "
                                   "tokenizer has 103 tokens — save the model with its embeddings resized to the "
                                   "tokenizer (model.resize_token_embeddings(len(tokenizer)))")
    # a Hub id the local cache does not hold: the download command, under the teacher's key
    assert problem(opd("org/no-such-teacher")).startswith(
        "teacher.path: org/no-such-teacher is not a local directory and not in the HF cache")


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_difference(tmp_path):
    more = build_tokenizer()
    more.add_tokens(["<extra>"])
    assert problem(opd(teacher_dir(tmp_path / "vocab", more))) == (
        f"teacher.path: the teacher's tokenizer ({tmp_path}/vocab) is not the student's: the vocabularies differ: "
        f"the teacher has 1 token(s) the student has not, e.g. '<extra>' — {FIX}")
    eos = build_tokenizer()
    eos.eos_token = eos.convert_ids_to_tokens(1)  # the bos token's id, 1, instead of 2
    assert problem(opd(teacher_dir(tmp_path / "eos", eos))) == (
        f"teacher.path: the teacher's tokenizer ({tmp_path}/eos) is not the student's: the eos_token differs "
        f"(id 2 in the student, 1 in the teacher) — {FIX}")
    chat = build_tokenizer()
    chat.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    template = teacher_dir(tmp_path / "template", chat)
    assert "the chat templates differ" in problem(opd(template))
    # one template given to both (data.chat_template), or none used: the teacher's own is not compared
    assert preflight(opd(template, data={"chat_template": "{{ messages[0]['content'] }}"})) is None
    assert preflight(opd(template, data={"prompt_format": "raw"})) is None


def test_a_students_model_path_is_compared_with_the_teacher(tmp_path):
    # model.path's tokenizer (not the built-in one) is the student's
    more = build_tokenizer()
    more.add_tokens(["<extra>"])
    student = teacher_dir(tmp_path / "student", more, config={"model_type": "llama", "vocab_size": 104,
                                                              "max_position_embeddings": 4096})
    msg = problem(opd(teacher_dir(tmp_path / "t"), model={"path": str(student)}))
    assert "the vocabularies differ (104 and 103 tokens; 1 of the student's tokens are absent from the teacher" in msg
    assert "e.g. '<extra>': id 103 in the student, absent from the teacher" in msg
