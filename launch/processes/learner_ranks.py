"""The learner ranks' half of `ProcessGraph`: starting them, their calls (a step, a weight push, a
checkpoint), and telling a dead rank from a live one. A rank is a Ray actor (`launch.processes.roles.LearnerRank`);
the run cannot go on without any of them, so a dead one is `LearnerDied`, one line naming it (the launcher says
what happens next: `launch.commands.train`, `--max-restarts`)."""

from __future__ import annotations

from pathlib import Path

from launch.processes.roles import LearnerRank, named


class LearnerDied(RuntimeError):
    """A learner rank's process is gone: the run cannot go on without it. The message is one line
    naming the rank, its process, its host and its log; the launcher adds what the run does next
    (`launch.commands.train`)."""



class LearnerRanks:
    """Mixed into `ProcessGraph`, whose `cfg`, `serial`, `_ray`, `_make`, `_get`, `_where` and `log_ref` it uses."""

    def start_learner(self, rank_cores: list, *, cluster: bool, weight_sync_token: str) -> None:
        """Create the learner ranks: rank 0 first, which picks the ranks' rendezvous on its own node
        (its node IP when `cluster`, loopback on a single machine; see `LearnerRank`), then the others
        with that address. They build their learners in the background (methods wait for them).
        `weight_sync_token` (`RunSecrets.weight_sync_token`) is kept for `connect_weight_sync`."""
        lc, w = self.cfg.learner, self.cfg.learner.world_size
        self._weight_sync_token = weight_sync_token
        def make(r: int):
            return self._make(LearnerRank, num_cpus=lc.cpus_per_rank, num_gpus=lc.gpus_per_rank, max_concurrency=2,
                              role=f"learner-{r}")

        first = make(0)(self.cfg, 0, w, str(self.model_dir), rank_cores[0], cluster)
        rendezvous = self._get(first.rendezvous.remote())
        self.ranks = [first] + [make(r)(self.cfg, r, w, str(self.model_dir), rank_cores[r], cluster, rendezvous)
                                for r in range(1, w)]

    def _on_ranks(self, futures):
        """`_get(futures)` of learner-rank calls; a rank whose process died raises `LearnerDied`."""
        if self.serial:
            return futures
        try:
            return self._get(futures)
        except self._ray.exceptions.RayActorError as e:
            raise LearnerDied(self._dead_ranks(e) or f"a learner rank died (process gone: {type(e).__name__})") from None

    def _dead_ranks(self, error: BaseException) -> str:
        """'learner rank 1 (pid 4242 on vm; log run/logs/learner-1.log) died (process gone: ActorDiedError)':
        the ranks that do not answer, as last seen by `where` (a SIGKILLed rank leaves no last words, so
        the line names its log rather than quoting it); '' when every rank answers."""
        dead = []
        for r, h in enumerate(self.ranks):
            try:
                self._ray.get(h.where.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - gone, or not answering: either way it cannot train
                was = self._where.get(f"learner/{r}", {})
                dead.append(named(f"learner rank {r}", was.get("pid", "?"), was.get("host", "?"),
                                  self.log_ref(f"learner-{r}", h)))
        return f"{' and '.join(dead)} died (process gone: {type(error).__name__})" if dead else ""

    def check_learner(self, timeout_s: float = 60.0) -> None:
        """Raise `LearnerDied` when a learner rank's process is gone or does not answer within `timeout_s`
        (a rank answers `where` even while it trains: two calls at a time; a dead one fails at once, the
        generous limit is for a loaded machine). For the driver's waits that call no rank themselves: a
        wait for a batch would otherwise outlive the learner (a rank killed during a push leaves every
        engine without a version, so no batch ever comes)."""
        if self.serial:
            return
        try:
            self._get([r.where.remote() for r in self.ranks], timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - died, or wedged: either way it cannot train
            raise LearnerDied(self._dead_ranks(e) or f"a learner rank did not answer within {timeout_s:.0f} s "
                              f"({type(e).__name__})") from None

    def step(self, groups, version: int) -> dict:
        batch = groups if self.serial else self._ray.put(groups)  # sent to the ranks once, not once per rank
        return self._on_ranks([r.step.remote(batch, version) for r in self.ranks])[0]

    def start_push(self, version: int) -> None:
        """Gather the weights on every rank and start sending them as `version` (rank 0 sends in the
        background: `finish_push` waits for it, and a new `start_push` waits for the previous one)."""
        self._on_ranks([r.push_weights.remote(version) for r in self.ranks])

    def finish_push(self, watch=None, every_s: float = 2.0) -> dict:
        """Stats of the push in flight once every actor has loaded it ({} when none); raises its error.
        `watch()` is called every `every_s` while it waits (a health check, which may raise to stop waiting)."""
        result = self.ranks[0].push_result.remote()
        if not self.serial and watch is not None:
            while not self._ray.wait([result], timeout=every_s)[0]:
                watch()
        return self._on_ranks(result)

    def push_weights(self, version: int) -> dict:
        """Push `version` and wait until every actor has loaded it."""
        self.start_push(version)
        return self.finish_push()

    def save(self, path: Path, extra_state: dict) -> None:
        self._on_ranks([r.save.remote(str(path), extra_state) for r in self.ranks])

    def load(self, path: Path) -> dict:
        return self._get([r.load.remote(str(path)) for r in self.ranks])[0]

    def rank0_named(self) -> str:
        was = self._where.get("learner/0", {})
        return named("learner rank 0", was.get("pid", "?"), was.get("host", "?"), self.log_ref("learner-0", self.ranks[0]))

