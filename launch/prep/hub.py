"""Hub model ids (`--model Qwen/Qwen2.5-0.5B-Instruct`) resolved through the local Hugging Face cache.

Why not download: every process of a run, on every node, must load the same files from the same path
(`launch.state.storage`), and a download of gigabytes is a step users want to see and control, not one
hidden in a run's start. So a run only looks the id up in the cache (`huggingface_hub.snapshot_download`
with `local_files_only=True`: the snapshot that the cached `refs/main` names, with no network, so it works
offline) and uses that snapshot directory as `model.path` (config.yaml records it, pinning the revision).
An id that is not cached is refused before anything starts, with the command that downloads it and the
cache that was searched (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub).

A value is read as a Hub id only when no such path exists here and it has the shape `org/name`; a local
directory of the same name wins, as it does for transformers.
"""

from __future__ import annotations

import re
from pathlib import Path

from configs.loading import ConfigError

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


class ModelNotCached(ConfigError):
    """A Hub model id that the local HF cache does not hold (whole)."""


def is_hub_id(value: str, cwd: str | Path = ".") -> bool:
    """`value` names a Hub model rather than a local path (relative to `cwd`; module docstring)."""
    return bool(_REPO_ID.fullmatch(value)) and not (Path(cwd) / value).exists()


def cached_snapshot(repo_id: str, key: str = "model.path") -> Path:
    """The snapshot directory of `repo_id` in the local HF cache, or `ModelNotCached` naming `key`, the
    download command and the cache."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    fetch = f"`hf download {repo_id}` (older huggingface_hub: `huggingface-cli download {repo_id}`)"
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except IncompleteSnapshotError:
        raise ModelNotCached(f"{key}: {repo_id} is only partly in the HF cache {constants.HF_HUB_CACHE} — finish "
                             f"the download with {fetch}") from None
    except LocalEntryNotFoundError:
        raise ModelNotCached(f"{key}: {repo_id} is not a local directory and not in the HF cache "
                             f"{constants.HF_HUB_CACHE} — download it with {fetch}, set HF_HUB_CACHE (or HF_HOME) "
                             "to the cache that holds it, or pass a local HF model directory") from None


def model_dir(value: str, key: str = "model.path") -> Path:
    """The directory `value` names: itself, or the cached snapshot of a Hub id."""
    return cached_snapshot(value, key) if is_hub_id(value) else Path(value)
