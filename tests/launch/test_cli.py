"""`algo-train`'s command line (launch.cli): real subcommands (`evaluate` an alias of `eval`, `train` the same as
no command), no abbreviated flags, the closest flag or choice in an error, examples in --help, --version;
and `--push-to-hub` (launch.commands.push) up to the upload call, whose HfApi methods are recorders here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import main, parse, parse_args

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).with_name("algo-train"))


def refusal(argv: list[str], capsys) -> str:
    """The last stderr line argparse exits with (status 2) for `algo-train argv`."""
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_no_flag_is_abbreviated_and_a_mistyped_one_gets_the_closest(capsys):
    assert refusal(["--actor", "2", "--algo", "grpo"], capsys) == (
        "algo-train [train]: error: unrecognized arguments: --actor 2 — did you mean --actors?")
    assert refusal(["--algo", "grpo", "--stesp", "3", "--max-stalenes", "2"], capsys) == (
        "algo-train [train]: error: unrecognized arguments: --stesp 3 --max-stalenes 2 — did you mean --steps "
        "(for --stesp), --max-staleness (for --max-stalenes)?")
    assert refusal(["--algo", "GRPO"], capsys).endswith("invalid choice: 'GRPO' (choose from 'grpo', 'luffy', 'opd', "
                                                       "'pacs', 'prime', 'pure', 'rloo', 'sft') — did you mean 'grpo'?")
    assert refusal(["eval", "--model", "m", "--data", "d", "--nn", "4"], capsys) == (
        "algo-train eval: error: unrecognized arguments: --nn 4 — did you mean --n?")
    assert refusal(["doctor", "--algo", "grpo", "--actor", "2"], capsys) == (
        "algo-train doctor: error: unrecognized arguments: --actor 2 — did you mean --actors?")
    assert refusal(["--algo", "grpo", "--zzz"], capsys).endswith("unrecognized arguments: --zzz")  # nothing close
    assert parse(["--algo", "grpo", "--actors", "2"])[1].rollout.num_actors == 2


def test_commands_are_subparsers(capsys):
    assert refusal(["evalu", "--model", "m"], capsys) == (
        "algo-train: error: argument COMMAND: invalid choice: 'evalu' (choose from 'train', 'eval', 'evaluate', "
        "'plot', 'doctor', 'scale') — did you mean 'eval'?")
    assert refusal(["--algo", "grpo", "eval"], capsys) == (
        "algo-train: error: eval: a command comes first — algo-train eval [its flags]")
    for argv, usage in ((["evaluate", "--help"], "usage: algo-train eval [-h] --model DIR --data FILE"),
                        (["eval", "-h"], "usage: algo-train eval [-h] --model DIR --data FILE"),
                        (["plot", "--help"], "usage: algo-train plot [-h] [-o OUTPUT] RUN_DIR [RUN_DIR ...]"),
                        (["doctor", "--help"], "usage: algo-train doctor [-h] [--algo"),
                        (["train", "--help"], "usage: algo-train [train] [-h] [--algo")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert " ".join(capsys.readouterr().out.split()).startswith(usage), argv  # argparse wraps long usages
    assert parse_args(["evaluate", "--model", "m", "--data", "d"]).handler.__module__ == "launch.commands.evaluate"
    _, with_command, _ = parse(["train", "--algo", "grpo", "--steps", "3"])
    _, without, _ = parse(["--algo", "grpo", "--steps", "3"])
    assert with_command == without and without.learner.steps == 3


def test_help_shows_examples_and_version_names_the_stack_without_importing_it():
    """--help and --version import neither torch nor vLLM (--help stays well under a second)."""
    code = ("import sys; from launch.cli import main\n"
            "for flag in ('--help', '--version'):\n"
            "    try: main([flag])\n"
            "    except SystemExit: pass\n"
            "print(sorted(m for m in ('torch', 'vllm', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    lines = out.splitlines()
    assert lines[-1] == "[]"
    assert re.fullmatch(r"algo-train \(impala-lm \S+\) with torch \S+, vllm(-cpu)? \S+, Python 3\.\d+\.\d+", lines[-2])
    examples = out[out.index("examples:"):]
    assert "algo-train eval --model runs/q/hf/step_350" in examples and "eval (evaluate)" in out


def test_push_to_hub_is_refused_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--algo", "grpo", "--output", str(out), "--push-to-hub", "me/not a name"]) == 2
    assert capsys.readouterr().err.startswith("algo-train: --push-to-hub me/not a name: not a Hub repository id")
    assert not out.exists()


@pytest.mark.parametrize("env, hides_hub, expected", [
    ({}, False, "--push-to-hub: no Hugging Face token found (HF_TOKEN, or the token file of `hf auth login`) — run "
                "`hf auth login` or set HF_TOKEN to a token with write access"),
    ({"HF_TOKEN": "hf_test"}, False, "None"),
    ({"HF_TOKEN": "hf_test", "HF_HUB_OFFLINE": "1"}, False,
     "--push-to-hub: HF_HUB_OFFLINE is set, so nothing can be uploaded — unset it, or drop --push-to-hub"),
    ({"HF_TOKEN": "hf_test"}, True,
     "--push-to-hub: huggingface_hub is not installed — pip install huggingface_hub, or drop --push-to-hub"),
])
def test_push_needs_huggingface_hub_a_token_and_the_network(tmp_path, env, hides_hub, expected):
    """In a fresh interpreter whose HF_HOME holds no token file (huggingface_hub reads it at import)."""
    hide = "sys.modules['huggingface_hub'] = None; " if hides_hub else ""  # as if it were not installed
    code = f"import sys; {hide}from launch.commands.push import push_problem; print(push_problem('me/tiny'))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env=clean | {"HF_HOME": str(tmp_path / "hf")} | env).stdout
    assert out.strip() == expected


def test_push_uploads_the_final_export_to_a_private_repo(tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    from launch.commands.push import push_export

    run = tmp_path / "run"
    export = run / "hf" / "step_3"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    calls, said = [], []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create_repo", repo_id, kw))
                        or f"https://huggingface.co/{repo_id}")
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kw: calls.append(("upload_folder", kw)))
    assert push_export(run, "me/tiny", private=True, say=said.append) == 1  # no summary.json: nothing named
    assert calls == [] and said == [f"[hub] {run} has no HF export to push (summary.json names none) — nothing "
                                    "was uploaded"]
    (run / "summary.json").write_text(json.dumps({"step": 3, "model": str(export)}))
    assert push_export(run, "me/tiny", private=True, say=said.append) == 0
    assert calls == [("create_repo", "me/tiny", {"private": True, "exist_ok": True, "repo_type": "model"}),
                     ("upload_folder", {"repo_id": "me/tiny", "folder_path": export, "repo_type": "model",
                                        "commit_message": "algo-train: run, step_3"})]
    assert said[-1] == f"[hub] pushed {export} to https://huggingface.co/me/tiny"

    def refused(self, **kw):
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(HfApi, "upload_folder", refused)
    assert push_export(run, "me/tiny", private=False, say=said.append) == 1
    assert calls[-1] == ("create_repo", "me/tiny", {"private": False, "exist_ok": True, "repo_type": "model"})
    assert said[-1] == (f"[hub] pushing {export} to me/tiny failed (PermissionError: 403 Forbidden) — the export is "
                        f"intact; upload it with: hf upload me/tiny {export}")


def test_an_algorithm_of_the_field_that_is_an_option_here_is_answered_with_its_settings():
    import re

    from configs.loading import resolve
    from launch.commands.run_flags import VARIANTS, did_you_mean

    said = did_you_mean("argument --algo: invalid choice: 'DAPO' (choose from 'grpo', 'rloo')", ["--algo"])
    assert said.startswith(" — DAPO is a variant here: --algo grpo --set loss.clip_high=0.28"), said
    assert did_you_mean("argument --algo: invalid choice: 'Dr.GRPO' (choose from 'grpo')", []).startswith(
        " — Dr.GRPO is a variant here: --algo grpo --set grpo.use_std=false")
    for hint in VARIANTS.values():  # every setting named resolves as a config of the algorithm named
        algo = re.match(r"--algo (\w+)", hint)
        if algo:
            resolve(algo.group(1), overrides=re.findall(r"--set ([^\s)]+)", hint.replace("=N", "=64")))
