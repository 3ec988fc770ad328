"""`actors.adapters.AdapterPins` on its own: which adapter a request gets, and when an old one is dropped
(a recording engine stands in for vLLM's add_lora / remove_lora; tests/actors/test_actor_adapters.py runs
the real engine)."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.adapters import AdapterPins, adapter_config, lora_id
from configs.lora_section import LoraConfig


class Engine:
    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    async def add_lora(self, request) -> bool:
        self.calls.append(("add", request.lora_int_id))
        return True

    async def remove_lora(self, lora_int_id: int) -> bool:
        self.calls.append(("remove", lora_int_id))
        return True


def test_requests_keep_their_adapter_and_old_ones_go_when_unpinned(tmp_path):
    engine = Engine()
    pins = AdapterPins(engine, tmp_path, adapter_config(LoraConfig(rank=8, alpha=16), "/models/base"))

    async def scenario():
        async with pins.pinned(0) as (v, req):  # before any push: the base, no adapter
            assert (v, req) == (0, None)
        pins.folder(1)
        await pins.add(1)
        first = pins.pinned(1)
        v1, req1 = await first.__aenter__()  # a request starts under version 1
        assert (v1, req1.lora_int_id) == (1, lora_id(1)) == (1, 2)
        pins.folder(2)
        await pins.add(2)  # version 2 lands while the request of 1 still runs: 1 stays
        assert sorted(pins.loaded) == [1, 2] and ("remove", 2) not in engine.calls
        async with pins.pinned(2) as (v, req):
            assert (v, req.lora_name) == (2, "v2")
        await first.__aexit__(None, None, None)  # the last request of 1 ends: adapter 1 is dropped
        assert sorted(pins.loaded) == [2] and engine.calls[-1] == ("remove", 2)
        assert not (tmp_path / "v1").exists() and (tmp_path / "v2" / "adapter_config.json").is_file()
        async with pins.pinned(1) as (v, _):  # 1 is gone: a request read version 1 before 2 landed
            assert v == 2  # runs under the newest, and its row says so
        assert pins.folder(2).name == "v2.again"  # a new group's first push repeats the version served
        await pins.add(2)  # kept as it is (vLLM would refuse a second adapter with its id)
        assert sorted(pins.loaded) == [2] and not (tmp_path / "v2.again").exists()
        with pytest.raises(RuntimeError, match="no adapter for version 7"):
            async with AdapterPins(engine, tmp_path / "other", {}).pinned(7):
                pass

    asyncio.run(scenario())
    assert engine.calls == [("add", 2), ("add", 3), ("remove", 2)]
    config = json.loads((tmp_path / "v2" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16, "LORA")
    pins.close()
    assert not tmp_path.exists()
