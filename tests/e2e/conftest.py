"""Fixtures of the end-to-end tests (helpers in `tests.e2e.helpers`)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> str:
    """The model cache of the session: the SFT-warmed tiny model is built once (~30 s). E2E_MODEL_CACHE=DIR
    reuses DIR instead (one built earlier; it must hold a single SFT-warmed model)."""
    return os.environ.get("E2E_MODEL_CACHE") or str(tmp_path_factory.mktemp("model-cache"))
