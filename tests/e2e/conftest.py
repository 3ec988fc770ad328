"""Fixtures of the end-to-end tests (helpers in `tests.e2e.helpers`)."""

from __future__ import annotations

import os

import pytest

from tests.e2e.real_model import RealAssets, build_real_assets


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> str:
    """The model cache of the session: the built-in tiny model, built once (seconds; the runs here use it
    untrained, `tests.e2e.helpers.UNTRAINED`). E2E_MODEL_CACHE=DIR reuses DIR instead (one built earlier; it
    must hold that one model)."""
    return os.environ.get("E2E_MODEL_CACHE") or str(tmp_path_factory.mktemp("model-cache"))


@pytest.fixture(scope="session")
def real_assets(tmp_path_factory) -> RealAssets:
    """The real-tokenizer model, its PURE PRM and MATH-500 (`tests.e2e.real_model`), built once (seconds)."""
    return build_real_assets(tmp_path_factory.mktemp("real-model"))
