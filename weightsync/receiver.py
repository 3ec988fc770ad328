"""Actor side of the weight sync: drives one vLLM ``AsyncLLM`` through vLLM's native weight-transfer API.

Why a helper: every actor must perform the same sequence, in the same order, for every push the
learner announces, and must never leave its engine paused:

    pause_generation(mode="keep")      in-flight requests are frozen, not aborted
    start_weight_update()              the transfer engine prepares (ours, weightsync.gloo.engine: a reload)
    update_weights({version, seq, ...}) the worker receives the push and loads it
    finish_weight_update(str(version)) reload finalised; the engine now reports the version
    resume_generation()                in ``finally``: also after a failure, but only once the
                                       engine is relabelled NO_VERSION ("none", not an integer)
then it acknowledges the version the engine reports (or the error) to the learner's store. After a
failed or aborted push the engine serves under NO_VERSION until the next complete push: its rows
are dropped by the actor (``actors.rows.NoVersionError``), never trained.

The helper is blind to the data plane (``weightsync.plane``): it passes the plane's init_info
(``plane/<rank>`` in the store) to ``init_weight_transfer_engine`` and each push's update_info (in
``push/<k>``) to ``update_weights``, unchanged. The engine must be built with the transfer backend
the sender's plane names (``engine_backend`` in its config; ``engine_args_kwargs(backend)``), and for
"gloo" the ``weightsync`` package installed so vLLM loads our plugin.

Usage inside an actor process::

    rx = WeightReceiver(engine, host, port, token=token, name="actor-3", initial_version=0)
    await rx.init()                                   # admitted with the token, joins the group
    asyncio.create_task(rx.run())                     # applies every push as it is announced
    ... stamp generated tokens with rx.version ...
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import torch.distributed as dist

from weightsync import backends
from weightsync.protocol import (
    WeightSyncError,
    get_json,
    join_group,
    key_plane,
    key_push,
    key_rank,
    post_ack,
    post_nack,
    process_info,
    set_json,
)

logger = logging.getLogger(__name__)

NO_VERSION = "none"  # the engine's weight-version label after a failed push: its weights are of no version


def engine_args_kwargs(backend: str = "gloo") -> dict:
    """Extra ``AsyncEngineArgs`` keyword arguments that enable the transfer engine of the data plane
    ``backend`` (a resolved ``weight_sync.backend``, looked up in ``weightsync.backends``: "gloo" = our
    ``weightsync.gloo.engine``, "nccl" = our ``weightsync.nccl.engine`` over vLLM's NCCL engines)."""
    engine_backend = backends.get(backend).engine_backend  # ValueError for a name not registered
    from vllm.config.weight_transfer import WeightTransferConfig

    return {"weight_transfer_config": WeightTransferConfig(backend=engine_backend)}


class WeightReceiver:
    """Receives the learner's weight pushes into ``engine`` (an ``AsyncLLM`` / vLLM ``EngineClient``).

    ``clear_cache`` (``weight_sync.clear_cache``): True drops the KV/prefix cache at each pause: kept
    requests are then re-prefilled with the new weights on resume (every token after the update depends
    on the new weights only; costs a prefill of prompt + tokens so far of every request in flight, per
    push) and no new request reuses a prefix computed with the old ones. False keeps it: no re-prefill,
    but tokens labelled with the new version attend to keys/values the old weights computed for the same
    request, so a token's version says which weights sampled it, not which weights its whole context went
    through. Prefix caching stays on: the actor salts every request with the weight version it starts
    under (`actors.generate.request_prompt`), so a new request never reuses a prefix that older weights
    computed. Every weight a row saw is then no older than the version its request started under, which
    its credit was checked at; that is also its oldest token's version, the one the staleness bound is
    measured by, unless a push landed while the request still waited in the engine's queue (its prompt
    may then hold KV of the version before its first token's). ``version`` is the version the engine serves,
    ``None`` after a failed push (the engine is then labelled ``NO_VERSION`` until the next complete
    push: ``_serve_no_version``). ``token`` is the run's
    weight-sync token (``RunSecrets.weight_sync_token``), which the sender checks before admitting
    this receiver; the vLLM worker gets only the group's derived key prefix, never the token.
    """

    def __init__(self, engine, host: str, port: int, *, token: str, name: str, initial_version: int | None = 0,
                 clear_cache: bool = True, on_update: Callable[[int], Awaitable[None] | None] | None = None,
                 adapters=None):
        self.engine = engine
        self.host, self.port = host, int(port)
        self.token = token
        self.name = name
        self.version: int | None = initial_version
        self.clear_cache = clear_cache
        self.on_update = on_update
        self.adapters = adapters  # actors.adapters.AdapterPins: every push is a LoRA adapter (`_apply_adapter`)
        self.rank: int | None = None
        self.last_pause: tuple[float, float] | None = None  # (paused_at, resumed_at), time.monotonic()
        self._store = None
        self._seq = 0
        self._config: dict = {}

    async def init(self, host: str | None = None, port: int | None = None) -> int:
        """Get admitted by the learner's sender (``WeightSyncError`` when refused) and join the
        transfer group; returns this rank.

        After a failed push the old group is unusable: the learner starts a new ``WeightSender`` and
        every surviving actor calls ``init(new_host, new_port)`` again (stop ``run`` first)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        if host is not None:
            self.host = host
        if port is not None:
            self.port = int(port)
        self._seq = 0
        store, self._config, rank, _ = await asyncio.to_thread(join_group, self.host, self.port, self.token,
                                                               self.name)
        await asyncio.to_thread(set_json, store, key_rank(rank), process_info(self.name))
        plane_info = {**await asyncio.to_thread(get_json, store, key_plane(rank)), "prefix": store.handle}  # + key
        store.set_timeout(timedelta(seconds=float(self._config["timeout_s"])))
        self._store, self.rank = store, rank
        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=plane_info))
        return rank

    async def wait_for_push(self, timeout_s: float | None = None) -> int | None:
        """Version of the next announced push, or ``None`` if none was announced within ``timeout_s``."""
        self._require_init()
        key = key_push(self._seq + 1)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            # A server-side wait (wakes as soon as the key is set) in slices of <= 0.5 s, so the
            # caller can be cancelled; a timed-out slice raises DistStoreError, anything else
            # (the learner's store is gone) propagates.
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                return None
            try:
                await asyncio.to_thread(self._store.wait, [key], timedelta(seconds=left))
            except dist.DistStoreError:
                continue
            return int((await asyncio.to_thread(get_json, self._store, key))["version"])

    async def apply_push(self) -> int:
        """Load the next announced push (call after ``wait_for_push``); returns its version."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._require_init()
        seq = self._seq + 1
        push = await asyncio.to_thread(get_json, self._store, key_push(seq))
        version = int(push["version"])
        self._seq = seq
        if self.adapters is not None:
            return await self._apply_adapter(seq, version, push["info"])
        t0 = time.monotonic()
        marks: dict[str, float] = {}
        try:
            await self.engine.pause_generation(mode="keep", clear_cache=self.clear_cache)
            t_paused = marks["pause"] = time.monotonic()
            try:
                await self.engine.start_weight_update()
                marks["start"] = time.monotonic()
                await self.engine.update_weights(WeightTransferUpdateRequest(
                    update_info={"version": version, "seq": seq, **push["info"]}))
                marks["update"] = time.monotonic()
                await self.engine.finish_weight_update(weight_version=str(version))
                marks["finish"] = time.monotonic()
            except BaseException:  # relabelled while still paused: no token of the mixed model has a version
                await self._serve_no_version()
                raise
            finally:
                await self._resume()
                self.last_pause = (t_paused, marks.setdefault("resume", time.monotonic()))
            loaded = await self.engine.get_weight_version()
        except Exception as e:
            await self._serve_no_version()  # also when the pause itself failed
            await asyncio.to_thread(post_nack, self._store, seq, self.rank, repr(e))
            raise WeightSyncError(f"{self.name}: loading version {version} failed: {e!r}") from e
        except BaseException:  # cancelled mid-update: the engine may hold a partial update
            await self._serve_no_version()
            raise
        prev, phases = t0, {}
        for phase, t in marks.items():  # seconds spent in each step, in order
            phases[phase], prev = t - prev, t
        await self._loaded(seq, version, loaded, t0, self.last_pause[1] - self.last_pause[0], phases)
        return version

    async def _apply_adapter(self, seq: int, version: int, info: dict) -> int:
        """A LoRA adapter push: the worker writes the adapter to a new folder (`weightsync.gloo.engine`), which
        is registered as version `version`'s adapter (`actors.adapters.AdapterPins.add`). The base weights are
        untouched, so the engine is not paused: requests in flight finish with the adapter they started with.
        A failure leaves every adapter already served in place, and the engine keeps its version."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        t0 = time.monotonic()
        folder = self.adapters.folder(version)
        try:
            await self.engine.start_weight_update()  # opens vLLM's update session; loads nothing
            await self.engine.update_weights(WeightTransferUpdateRequest(
                update_info={"version": version, "seq": seq, **info, "adapter_dir": str(folder)}))
            await self.engine.finish_weight_update(weight_version=str(version))
            received = time.monotonic()
            await self.adapters.add(version)
            loaded = await self.engine.get_weight_version()
        except Exception as e:
            self.adapters.discard(version)
            await asyncio.to_thread(post_nack, self._store, seq, self.rank, repr(e))
            raise WeightSyncError(f"{self.name}: loading adapter version {version} failed: {e!r}") from e
        self.last_pause = None
        await self._loaded(seq, version, loaded, t0, 0.0,
                           {"update": received - t0, "add_lora": time.monotonic() - received})
        return version

    async def _loaded(self, seq: int, version: int, loaded: str, t0: float, paused_s: float, phases: dict) -> None:
        self.version = version
        await asyncio.to_thread(post_ack, self._store, seq, self.rank, {
            "version": loaded, "seconds": time.monotonic() - t0, "paused_s": paused_s, "phases": phases})
        if self.on_update is not None:
            r = self.on_update(version)
            if asyncio.iscoroutine(r):
                await r

    async def _serve_no_version(self) -> None:
        """After a failed or aborted push: the engine's weights are a mix of the old version, parts of the
        new one and, on some paths, never-filled buffers (``weightsync.gloo.engine._abandon_reload``,
        ``weightsync.nccl.engine``). Label them ``NO_VERSION`` (not an integer) until the next complete
        push relabels them: every token sampled meanwhile carries it, and ``actors.rows`` refuses rows
        holding such tokens (the actor drops and counts those groups). ``version`` becomes ``None``."""
        self.version = None
        try:
            await self.engine.update_weight_version(NO_VERSION)
        except Exception:  # a dead engine serves nothing anyway
            logger.exception("%s: could not label the engine's weights %r after a failed push", self.name,
                             NO_VERSION)

    async def _resume(self) -> None:
        try:
            await self.engine.resume_generation()
        except Exception:
            logger.exception("%s: resume_generation failed after a weight update", self.name)
            raise

    async def sync_once(self, timeout_s: float | None = None) -> int | None:
        """Wait for the next push and load it; ``None`` if none was announced within ``timeout_s``."""
        if await self.wait_for_push(timeout_s) is None:
            return None
        return await self.apply_push()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Apply every push as it is announced until ``stop`` is set. A failed push is logged and the
        loop keeps going (the learner raises on its side and decides what to do, typically a new
        sender that the actor rejoins with ``init``). The loop ends with an exception when the engine
        is dead or the learner's store is unreachable."""
        while stop is None or not stop.is_set():
            try:
                await self.sync_once(timeout_s=0.5)
            except WeightSyncError:
                logger.exception("%s: weight push failed", self.name)
                if self.engine.errored:
                    raise

    def _require_init(self) -> None:
        if self._store is None or self.rank is None:
            raise RuntimeError(f"{self.name}: WeightReceiver.init() has not been called")

    async def close(self) -> None:
        if self._store is not None:
            try:
                await self.engine.shutdown_weight_transfer_engine()
            finally:
                self._store = None
