"""Version-pinned LoRA adapters on one engine (`model.lora.sync: adapter`).

Why pinned: an adapter push leaves the base weights alone and adds the new version's adapter beside the older
ones, so a request can keep the adapter it started with to its end. Every token of a request is then sampled
by one version's weights, the one it started under, and its row carries that version exactly; no row mixes
versions, and no push has to pause the engine.

How:
- Version v is served by vLLM adapter id v + 1 (ids must be ≥ 1), named "v<v>", loaded from `<scratch>/v<v>/`:
  adapter_config.json written here from `model.lora`, adapter_model.safetensors by the engine's worker as the
  push arrives (`weightsync.gloo.engine.save_adapter`).
- Version 0 before any push is the base with no adapter: B starts at zero, so it is the same policy.
- `pinned(v)` holds adapter v for one request and yields the version it really serves: v, or the newest
  version when v's adapter is gone already (a push landed between reading the version and starting the
  request, and v had no other user). A row is stamped with the version its request ran under.
- An adapter that is neither the newest nor pinned is removed from the engine (`remove_lora`) and its folder
  deleted: at most the versions of the requests in flight plus the newest stay loaded.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def adapter_config(lora, base_model: str) -> dict:
    """peft's adapter_config.json fields vLLM's LoRA loader reads (`vllm.lora.peft_helper.PEFTHelper`), for
    `model.lora` (`configs.lora_section.LoraConfig`) on the model in `base_model`."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_model),
            "r": lora.rank, "lora_alpha": lora.alpha if lora.alpha is not None else lora.rank,
            "target_modules": list(lora.target_modules), "lora_dropout": 0.0, "bias": "none"}


def engine_adapters(cfg, engine, name: str, model_dir: str) -> AdapterPins | None:
    """The adapters of an actor's engine when the run's pushes are adapters (`model.lora.sync: adapter`), kept in
    a scratch folder of its own; None otherwise."""
    if not cfg.model.lora.adapter_sync:
        return None
    return AdapterPins(engine, Path(tempfile.mkdtemp(prefix=f"{name}-lora-")), adapter_config(cfg.model.lora, model_dir))


def lora_id(version: int) -> int:
    """vLLM's adapter id of `version`."""
    return int(version) + 1


class AdapterPins:
    """The adapters one engine (an `AsyncLLM`) serves, by version, and the requests holding each."""

    def __init__(self, engine, scratch: Path, config: dict):
        self.engine, self.scratch, self.config = engine, Path(scratch), config
        self.loaded: dict[int, object] = {}  # version -> vLLM LoRARequest
        self.newest: int | None = None
        self.pins: Counter[int] = Counter()

    def _path(self, version: int) -> Path:
        # a version the engine serves already is pushed again as a new group's first push: received beside it
        return self.scratch / (f"v{version}.again" if version in self.loaded else f"v{version}")

    def folder(self, version: int) -> Path:
        """The (new) folder adapter `version` is written to, its adapter_config.json in place."""
        path = self._path(int(version))
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        (path / ADAPTER_CONFIG).write_text(json.dumps(self.config))
        return path

    async def add(self, version: int) -> None:
        """Register the adapter written to `folder(version)` with the engine: new requests get it; older
        adapters nobody holds are removed. A version the engine serves already (a new transfer group starts
        with a push of the current version) keeps its adapter: the same version is the same weights."""
        from vllm.lora.request import LoRARequest

        version = int(version)
        if version in self.loaded:
            shutil.rmtree(self._path(version), ignore_errors=True)
            self.newest = version
            await self._retire()
            return
        request = LoRARequest(f"v{version}", lora_id(version), str(self.scratch / f"v{version}"))
        if not await self.engine.add_lora(request):
            raise RuntimeError(f"the engine refused adapter v{version} ({request.lora_path})")
        self.loaded[version], self.newest = request, version
        await self._retire()

    def discard(self, version: int) -> None:
        """Forget the folder of a push that failed before `add`."""
        shutil.rmtree(self._path(int(version)), ignore_errors=True)

    @contextlib.asynccontextmanager
    async def pinned(self, version: int):
        """(version served, LoRARequest or None for the base) for one request, held until it ends."""
        v = int(version)
        if v not in self.loaded and self.newest is not None:
            v = self.newest  # v's adapter was retired before this request started: run it under the newest
        if v not in self.loaded and (self.newest is not None or v != 0):
            raise RuntimeError(f"no adapter for version {version}: the engine serves {sorted(self.loaded)}")
        self.pins[v] += 1
        try:
            yield v, self.loaded.get(v)
        finally:
            self.pins[v] -= 1
            if not self.pins[v]:
                del self.pins[v]
                await self._retire()

    async def _retire(self) -> None:
        for v in [v for v in self.loaded if v != self.newest and not self.pins[v]]:
            request = self.loaded.pop(v)
            await self.engine.remove_lora(request.lora_int_id)
            shutil.rmtree(self.scratch / f"v{v}", ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
