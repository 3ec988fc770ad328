"""A local Hugging Face hub cache holding a model, laid out as huggingface_hub writes it, for the tests of
Hub model ids (`launch.prep.hub`): ``models--org--name/refs/main`` names a commit, whose snapshot folder
links each file to its blob (``snapshots/<commit>/<file> -> ../../blobs/<sha256>``). Point HF_HUB_CACHE
at the returned root's folder, as a user does with theirs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "4f1c0ffee4f1c0ffee4f1c0ffee4f1c0ffee4f1c"


def hub_cache(root: Path, repo_id: str, model: Path) -> Path:
    """`root` as the HF hub cache holding `model`'s files as `repo_id` at COMMIT (main); returns the snapshot."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in sorted(model.iterdir()):
        if f.is_file():
            blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            blob.write_bytes(f.read_bytes())
            (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot
