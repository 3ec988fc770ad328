"""Which actors are in the run, and the ones on their way in: `ProcessGraph`'s half that changes its actor
set while the run trains.

- `live`: the actors in the weight-sync group that generate.
- A dead actor's successor (`begin_replacing`) and the actors a scale-up adds (`begin_adding`) start their
  engines in the background; `poll_replacements` says when each is up, and `admit` makes it live (the driver
  rebuilds the weight-sync group and pushes the current version first: `launch.state.recovery`).
- A scale-down's leavers go with `remove_actors`; a changed actor count cuts new shards (`reshard`).

The ids stay 0..n-1: a successor takes its predecessor's id (and shard), a scale-up appends ids, a scale-down
removes the highest. What the actors generate is decided by the ledger (`launch.state.ledger`), never here.
"""

from __future__ import annotations

import time

from buffer.records import Key
from launch.planning.resources import ResourceError


class Membership:
    """Mixed into `ProcessGraph`, whose `actors`, `pids`, `live`, `shards`, `serial`, `cfg`, `placement`,
    `_new_actor`, `_start_engines`, `kill_actors`, `_get`, `_replacing`, `_replaced` and `_growth` it uses."""

    def begin_replacing(self, ids: list[int], skip: list[Key], version: int) -> None:
        """Start successors of the (killed) actors `ids`, skipping the prompts `skip` (see `ActorRole`),
        whose weights are labelled `version`, without waiting for their engines (`poll_replacements`).
        They leave `live` now, and neither join the weight sync nor generate until `admit`ted."""
        self.live = [i for i in self.live if i not in ids]
        for i in ids:
            self.actors[i] = self._new_actor(i, skip, version)
        self._begin(ids)
        self.restarts += len(ids)

    def begin_adding(self, count: int, version: int) -> list[int]:
        """Start `count` more actors (the next ids) without waiting, their bundles reserved in one more
        placement group (`Placement.grow_actors`); like successors they join once `admit`ted, and they are
        resharded before they generate. Returns their ids."""
        first = len(self.actors)
        ids = list(range(first, first + count))
        pg = None if self.serial else self.placement.grow_actors(first + count)
        self.actors += [None] * count
        self.pids += [None] * count
        for i in ids:
            self.actors[i] = self._new_actor(i, [], version)
        self._growth = (pg, ids, time.monotonic())
        self._begin(ids)
        return ids

    def _begin(self, ids: list[int]) -> None:
        if self.serial:
            self._replaced.update(zip(ids, self._start_engines(ids)))
        else:
            self._replacing = self._start_engines(ids, more=self._replacing)

    @property
    def replacing(self) -> list[int]:
        """Actors whose engines are still starting (successors and a scale-up's)."""
        return sorted(self._replaced) if self.serial else self._replacing.pending if self._replacing else []

    def poll_replacements(self, timeout_s: float | None = 0.0) -> tuple[dict[int, int], dict[int, BaseException]]:
        """({actor: pid} of the actors whose engines came up since the last call, {actor: error} of those
        whose start failed), waiting up to `timeout_s` (None: without limit) for a first one. A scale-up
        whose placement group Ray has not placed within `placement_timeout_s` fails with `ResourceError`."""
        if self.serial:
            up, self._replaced = self._replaced, {}
            return up, {}
        up, failed = self._replacing.poll(timeout_s) if self._replacing else ({}, {})
        for i, pid in up.items():
            self.pids[i] = pid
        if self._growth is not None:
            pg, ids, since = self._growth
            waiting = [i for i in ids if i in self._replacing.pending]
            if not waiting:
                self._growth = None
            elif pg is not None and time.monotonic() - since > self.cfg.placement_timeout_s and not pg.wait(0):
                why = ResourceError(f"Ray could not place {len(ids)} more actor(s) within "
                                    f"{self.cfg.placement_timeout_s:g} s (placement_timeout_s): free resources or "
                                    "add a node with the run's resources, then ask again")
                failed |= {i: why for i in waiting}
        return up, failed

    def admit(self, ids: list[int]) -> None:
        """Actors `ids`, up, become live: the next `connect_weight_sync` includes them."""
        self.live = sorted(set(self.live) | set(ids))

    def remove_actors(self, ids: list[int]) -> None:
        """Kill the actors `ids` (the highest ids: the run shrinks, or a scale-up is cancelled) and forget
        them; a scale-up's placement group they were the only ones of is given back."""
        keep = len(self.actors) - len(ids)
        if sorted(ids) != list(range(keep, len(self.actors))):
            raise ValueError(f"only the last actors can leave: {sorted(ids)} of {len(self.actors)}")
        self.kill_actors(ids)
        if self._replacing is not None:
            self._replacing.drop(ids)
        if self._growth is not None and set(self._growth[1]) <= set(ids):
            if self._growth[0] is not None:
                self.placement.forget(self._growth[0])
            self._growth = None
        self.actors, self.pids = self.actors[:keep], self.pids[:keep]
        self.live = [i for i in self.live if i < keep]

    def reshard(self, num_actors: int, skip: list[Key]) -> None:
        """Every live actor (stopped: `stop_actors`) takes shard i::`num_actors`, walking it past `skip`."""
        self._get([self.actors[i].reshard.remote(num_actors, [list(k) for k in skip]) for i in self.live])
        self.shards = num_actors
