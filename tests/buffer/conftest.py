"""Fixtures: real buffer service processes (spawned), stopped at the end of each test."""

from __future__ import annotations

import pytest

from buffer.process import start_buffer_process


@pytest.fixture
def start_buffer():
    procs = []

    def start(**overrides) -> str:
        settings = {"batch_prompts": 2, "max_staleness": 1, **overrides}
        proc, address = start_buffer_process(None, **settings)
        procs.append(proc)
        return address

    start.procs = procs
    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(10)
        assert p.exitcode is not None, "buffer process did not stop"
