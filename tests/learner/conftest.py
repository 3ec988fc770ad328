"""Shared fixtures: the tiny model (built once per session) and the in-process world of one rank."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from transformers import AutoTokenizer

from tasks.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("learner_models") / "tiny")


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
    """Another tiny model (other weights, the same tokenizer): a teacher for `--algo opd`."""
    return build_tiny_model(tmp_path_factory.mktemp("learner_models") / "teacher", seed=1)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module", autouse=True)
def _single_rank_group():
    """In-process learners share one gloo group of size 1; it is torn down after each module so other
    test folders can create their own."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
