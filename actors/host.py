"""`EngineHost`: one `AsyncLLM` on its own event-loop thread, callable from synchronous code.

Why: `AsyncLLM` binds its output handler (and every request's output queue) to the asyncio loop
that first uses it, so the engine and everything that talks to it must live on one loop for the
engine's whole life. Synchronous callers -- the serial-mode orchestrator, a Ray actor method,
pytest -- submit coroutines to that loop with `call`. Several `RolloutActor`s may share one host
(tests share one engine because starting one costs ~40 s on 2 cores); by default each actor owns
its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

from actors.engine import EngineSpec, build_engine, shutdown_engine


class EngineHost:
    """A daemon thread running an event loop, and (after `start`) an engine built on that loop."""

    def __init__(self, spec: EngineSpec | None = None, name: str = "engine"):
        self.spec = spec
        self.engine = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-loop", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, coro) -> Future:
        if self._closed:
            coro.close()
            raise RuntimeError("engine host is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro, timeout_s: float | None = None):
        """Run `coro` on the host's loop and return its result (re-raises its exception)."""
        return self.submit(coro).result(timeout_s)

    def start(self) -> None:
        """Build the engine (if `spec` was given and it is not built yet)."""
        if self.engine is not None or self.spec is None:
            return

        async def make():
            return build_engine(self.spec)

        self.engine = self.call(make())

    def close(self) -> None:
        """Shut the engine down and stop the loop thread (idempotent)."""
        if self._closed:
            return
        if self.engine is not None:
            async def down():
                shutdown_engine(self.engine)

            try:
                self.call(down(), timeout_s=120)
            finally:
                self.engine = None
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def served_labels(self, timeout_s: float = 60.0) -> dict:
        """The engine's weight-version label and the labels of one greedy token it generates now."""
        async def go():
            from vllm import SamplingParams

            label = await self.engine.get_weight_version()
            params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
            final = None
            async for out in self.engine.generate({"prompt_token_ids": [1, 2, 3]}, params,
                                                  request_id=f"labels-{time.monotonic_ns()}"):
                final = out
            return {"label": label, "token_labels": [s.version for s in final.outputs[0].weight_versions or []]}

        return self.call(go(), timeout_s=timeout_s)

    def __enter__(self) -> EngineHost:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
