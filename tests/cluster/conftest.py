"""Fixtures of the two-host tests: one two-node Ray cluster in network namespaces per session
(`tests.cluster.netns`), skipped only where namespaces cannot be made."""

from __future__ import annotations

import pytest

from tests.cluster import netns


@pytest.fixture(scope="session")
def two_hosts():
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"two-host tests need network namespaces: {reason}")
    hosts = netns.start()
    print(f"[two-hosts] Ray cluster {hosts.head_address} up in {hosts.startup_s:.1f} s: "
          + ", ".join(f"{n['ip']} {sorted(k for k in n['resources'] if k.startswith('host'))}" for n in hosts.nodes))
    try:
        yield hosts
    finally:
        hosts.close()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> str:
    """The model cache of the two-host runs: the built-in tiny model, built by the driver on A and read
    by B through the shared filesystem."""
    return str(tmp_path_factory.mktemp("model-cache"))
