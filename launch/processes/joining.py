"""How the actors join a run: their engines start (those sharing a GPU one after another: `EngineStarts`),
then they join learner rank 0's weight-sync group (a failure is one line of ours: `unformed_line`).

Why engines sharing a GPU start one at a time: a vLLM engine sizes its KV cache by profiling the GPU's
memory while it loads and runs a dummy batch, and assumes that no other process on the GPU changes its
memory meanwhile (vLLM 0.32 `v1/worker/gpu_worker.py`, `determine_available_memory`: it asserts when the
free memory grew during the profile, and an engine allocating beside it shrinks the cache it finds). With
`rollout.gpus_per_actor` a fraction, 2-4 engines share each GPU; started together they profile together.
Which actors share a GPU is what Ray assigned them (`ActorRole.gpu`: the node and the GPU ids), known
once they are placed, before their engines start; engines on GPUs of their own still start all at once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


def start_chains(keys: list[Hashable | None]) -> list[list[int]]:
    """Actors (by index) in start chains: those with the same key (sharing a GPU) in one chain, in index
    order, each started when the one before it is up; a None key (a GPU of its own, or no GPU) is a chain
    of its own. Chains start together."""
    chains: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        chains.setdefault(("own", i) if key is None else ("shared", key), []).append(i)
    return list(chains.values())


class EngineStarts:
    """The engine starts of some actors in flight (`start_chains`). `ray`: the Ray module (or a stand-in
    with `wait` and `get`); `start(i)` calls actor i's start and returns its object ref; `keys`: each
    actor's GPU (None: not shared). `wait()` drives the chains to their end and returns {actor: what its
    start returned} (its pid); the first start that fails raises its error there. `poll()` is the same
    without blocking (a replacement starts while the run trains: `launch.state.recovery`)."""

    def __init__(self, ray, ids: list[int], start: Callable[[int], object], keys: list[Hashable | None]):
        self._ray, self._start = ray, start
        self._next: dict[int, int] = {}
        self._pending: dict[object, int] = {}
        self.add(ids, keys)

    def add(self, ids: list[int], keys: list[Hashable | None]) -> None:
        """Start these actors' engines too (chained among themselves as `start_chains` says)."""
        for chain in start_chains(keys):
            chain = [ids[k] for k in chain]
            self._next.update(zip(chain, chain[1:]))
            self._launch(chain[0])

    def _launch(self, i: int) -> None:
        self._pending[self._start(i)] = i

    @property
    def pending(self) -> list[int]:
        """The actors whose starts have not ended yet (those not launched yet in their chain included)."""
        waiting = set(self._pending.values())
        for i in list(waiting):
            while i in self._next:
                i = self._next[i]
                waiting.add(i)
        return sorted(waiting)

    def poll(self, timeout_s: float | None = 0.0) -> tuple[dict[int, object], dict[int, BaseException]]:
        """The starts that ended since the last call, waiting up to `timeout_s` (None: without limit) for
        the first one: ({actor: what its start returned}, {actor: its error}). The next start of a chain
        is called as the one before it ends (failed or not: it is a GPU of its own then)."""
        if not self._pending:
            return {}, {}
        refs = list(self._pending)
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        done, failed = {}, {}
        for ref in ready:
            i = self._pending.pop(ref)
            try:
                done[i] = self._ray.get(ref)
            except Exception as e:  # noqa: BLE001 - handed to the caller, who names the actor
                failed[i] = e
            if i in self._next:
                self._launch(self._next.pop(i))
        return done, failed

    def drop(self, ids: list[int]) -> None:
        """Forget the starts of actors `ids` (they were killed: a cancelled scale-up)."""
        self._pending = {ref: i for ref, i in self._pending.items() if i not in ids}
        self._next = {i: j for i, j in self._next.items() if i not in ids and j not in ids}

    def wait(self) -> dict[int, object]:
        done: dict[int, object] = {}
        while self._pending:
            ended, failed = self.poll(None)
            if failed:
                raise next(iter(failed.values()))
            done.update(ended)
        return done


def shares_gpus(gpus_per_actor) -> bool:
    """True when engines may share a GPU: a fraction of one per actor (0 < g < 1)."""
    return isinstance(gpus_per_actor, int | float) and 0 < gpus_per_actor < 1


def first_failure(ray, calls: list[tuple[Callable[[], str], object]], error: BaseException
                  ) -> tuple[str, BaseException]:
    """(who, its error) of the first of `calls` — (who made it, its object ref) — that has ended in an
    error; the last caller and `error` when none has yet (e.g. `error` was another one's timeout)."""
    ready, _ = ray.wait([ref for _, ref in calls], num_returns=len(calls), timeout=0)
    for who, ref in calls:
        if ref in ready:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - the failure to name
                return who(), e
    return calls[-1][0](), error


def unformed_line(who: str, error: BaseException, address: tuple[str, int]) -> str:
    """The one line a run stops with when its weight-sync group does not form: which role failed (as
    `launch.processes.roles.named` gives it), the first line of its error (Ray's wrapper unwrapped), and
    what to check: the actors must reach learner rank 0's address."""
    cause = getattr(error, "cause", None) or error
    why = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
    host, port = address
    return (f"[graph] the weight-sync group did not form: {who} failed ({type(cause).__name__}: {why}) — every "
            f"actor's node must reach learner rank 0 at {host}:{port}: check GLOO_SOCKET_IFNAME / "
            "NCCL_SOCKET_IFNAME of each node's `ray start` and the firewalls, and run `algo-train doctor` with "
            "the same flags")
