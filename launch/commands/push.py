"""`--push-to-hub REPO`: a run's final HF export, uploaded to a Hugging Face Hub model repository.

Who uploads: the `algo-train` process, once the run has finished (`launch.commands.train`). The export is
written by the run at its end (`hf/step_<N>`, named as `model` in summary.json); the learner ranks and the
driver never talk to the Hub, so a slow or failed upload neither stops nor slows training, and the run's
folder is complete whatever the upload does. A run that stopped early (Ctrl-C, a failure) is not pushed.

Checked before anything starts (`push_problem`), each refusal one line with the fix: huggingface_hub is
importable, REPO is a valid repository id, the Hub is not switched off (HF_HUB_OFFLINE), and a token is
found where huggingface_hub looks for it (HF_TOKEN, else the token file `hf auth login` writes under
HF_HOME). The repository is created when missing (private unless `--hub-public`; an existing one keeps its
visibility) and the export folder is uploaded as one commit (`HfApi.upload_folder`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def push_problem(repo: str) -> str | None:
    """Why `--push-to-hub repo` cannot work here (one line with the fix), or None."""
    try:
        from huggingface_hub import constants, get_token
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return "--push-to-hub: huggingface_hub is not installed — pip install huggingface_hub, or drop --push-to-hub"
    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        return f"--push-to-hub {repo}: not a Hub repository id ({e}) — pass NAME, USER/NAME or ORG/NAME"
    if constants.is_offline_mode():
        return "--push-to-hub: HF_HUB_OFFLINE is set, so nothing can be uploaded — unset it, or drop --push-to-hub"
    try:
        token = get_token()
    except Exception as e:  # an OIDC exchange (HF_OIDC_RESOURCE) raises what it meets
        return f"--push-to-hub: no Hugging Face token ({e}) — run `hf auth login` or set HF_TOKEN"
    if not token:
        return ("--push-to-hub: no Hugging Face token found (HF_TOKEN, or the token file of `hf auth login`) — run "
                "`hf auth login` or set HF_TOKEN to a token with write access")
    return None


def final_export(run_dir: Path) -> Path | None:
    """The HF export a finished run names in its summary.json (`model`), if it is there."""
    try:
        model = json.loads((run_dir / "summary.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(model) if model and Path(model).is_dir() else None


def push_export(run_dir: Path, repo: str, private: bool, say: Callable[[str], None] = print) -> int:
    """Upload the run's final export to `repo` (module docstring); 0 when it is there, else 1 with one line
    saying what failed and how to upload the folder by hand."""
    from huggingface_hub import HfApi

    folder = final_export(run_dir)
    if folder is None:
        say(f"[hub] {run_dir} has no HF export to push (summary.json names none) — nothing was uploaded")
        return 1
    api = HfApi()
    try:
        url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo, folder_path=folder, repo_type="model",
                          commit_message=f"algo-train: {run_dir.name}, {folder.name}")
    except Exception as e:  # network, permission, quota: the run is done and its export kept
        say(f"[hub] pushing {folder} to {repo} failed ({type(e).__name__}: {e}) — the export is intact; upload "
            f"it with: hf upload {repo} {folder}")
        return 1
    say(f"[hub] pushed {folder} to {url}")
    return 0
