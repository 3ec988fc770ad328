"""LoRA adapter pushes into a generating actor (`model.lora.sync: adapter`), through weightsync's real gloo
transfer into a real vLLM engine with LoRA on (its own engine: the folder's shared one serves no adapters).
This test process is the learner: it pushes adapter tensors under peft's names.

The pinning claim, checked token by token: a request started under version v finishes with adapter v after
v + 1 has landed, so every token of its row carries v, and its log mu equals the log-probs of the base with
adapter v merged in (HF, recomputed here), not those of v + 1. Afterwards new requests run under v + 1, and the
engine has dropped adapter v (nothing pins it any more)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tests.actors.conftest import MAX_MODEL_LEN, run_config
from tests.actors.helpers import (
    hf_token_logprobs,
    load_hf,
    on_actor_loop,
    pull_all,
    record_sent,
    wait_for,
    wait_rollouts,
)

pytestmark = pytest.mark.slow

TOKEN = "test-adapter-sync-token"
RANK, ALPHA = 8, 16.0


def lora_config():
    return run_config(rollout__n=4, rollout__max_response_tokens=200, rollout__prompts_in_flight=1,
                      buffer__max_staleness=1, model__lora__rank=RANK, model__lora__alpha=ALPHA)


@pytest.fixture(scope="module")
def lora_host(model_dir):
    from actors.engine import EngineSpec
    from actors.host import EngineHost

    spec = EngineSpec.from_config(lora_config(), model_dir, 0, max_model_len=MAX_MODEL_LEN)
    assert (spec.lora_rank, spec.max_loras) == (8, 3)  # max_staleness 1 + the newest + one landing: 3
    h = EngineHost(spec, name="lora-engine")
    try:
        h.start()
        yield h
    finally:
        h.close()


def adapter(model, seed: int, targets=("q_proj", "v_proj", "down_proj")) -> dict[str, torch.Tensor]:
    """A random adapter (peft names) on `targets` of every layer, large enough to move the log-probs."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] in targets and isinstance(m, torch.nn.Linear):
            out[f"base_model.model.{name}.lora_A.weight"] = 0.3 * torch.randn(RANK, m.in_features, generator=g)
            out[f"base_model.model.{name}.lora_B.weight"] = 0.3 * torch.randn(m.out_features, RANK, generator=g)
    return out


def merged(model_dir, tensors: dict[str, torch.Tensor]):
    """The HF model with `tensors` merged: W + (alpha / r)·B·A per adapted layer."""
    model = load_hf(model_dir)
    state = model.state_dict()
    for k, a in tensors.items():
        if ".lora_A." in k:
            layer = k.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = tensors[k.replace(".lora_A.", ".lora_B.")]
            state[f"{layer}.weight"] = state[f"{layer}.weight"] + (ALPHA / RANK) * b @ a
    model.load_state_dict(state)
    return model


def test_a_request_keeps_the_adapter_it_started_with(lora_host, model_dir, prompts, buffers, learner_client):
    from actors.actor import RolloutActor
    from weightsync import WeightSender

    cfg = lora_config()
    _, address = buffers.start(cfg)
    learner = learner_client(address)
    actor = RolloutActor(cfg, 0, model_dir, address, prompts, host=lora_host)
    sender = WeightSender(1, token=TOKEN, timeout_s=30, connect_timeout_s=120)
    try:
        actor.start()
        t = threading.Thread(target=sender.connect, daemon=True)
        t.start()
        actor.connect_weight_sync(*sender.address, TOKEN)
        t.join(60)
        actor.follow_weight_updates()
        base = load_hf(model_dir)
        adapters: dict[int, dict] = {}

        def push(v):
            adapters[v] = adapter(base, seed=v)
            learner.set_version(v)
            stats = sender.push(list(adapters[v].items()), version=v)
            assert stats["acks"] == {"actor-0": str(v)}
            wait_for(lambda: actor.version == v, 10, f"the actor to serve version {v}")

        # The push must land mid-generation: push a little after the group started, later at each retry.
        v, groups, straddled = 1, [], None
        push(v)
        for delay_s in (0.05, 0.2, 0.5, 1.0):
            sent, started = record_sent(actor), actor.stats()["groups_started"]
            actor.start_rollouts(max_groups=1)
            wait_for(lambda n=started: actor.stats()["groups_started"] > n, 30, "the group to start")
            time.sleep(delay_s)
            push(v + 1)
            in_flight = not sent  # v + 1 is served while the group started under v still generates
            assert wait_rollouts(actor, 120) == 1
            groups += pull_all(learner)
            v += 1
            if in_flight:
                straddled = (groups[-1], v - 1)
                break
        assert straddled, "version v + 1 never landed while a group of v was generating"
        actor.start_rollouts(max_groups=1)  # a group started under the newest version
        assert wait_rollouts(actor, 120) == 1
        groups += pull_all(learner)
        models = {u: merged(model_dir, a) for u, a in adapters.items()}

        for g in [straddled[0], groups[-1]]:
            want = int(g.samples[0].versions[0])
            prompt = g.prompt_tokens.tolist()
            for s in g.samples:
                assert (s.versions == want).all(), (want, np.unique(s.versions))  # pinned: one version
                tokens = s.tokens.tolist()
                err = {u: float(np.abs(hf_token_logprobs(m, prompt, tokens) - s.logprobs).mean())
                       for u, m in models.items() if u in (want, want + 1, want - 1)}
                assert err[want] < 1e-4, err  # sampled by adapter `want`, every token
                assert all(e > 1e-2 for u, e in err.items() if u != want), err  # another adapter differs
                print(f"version {want}: {len(tokens)} tokens, mean |log mu - HF log p| per adapter {err}")
        assert int(straddled[0].samples[0].versions[0]) == straddled[1]  # the straddling group kept v
        ids = set(on_actor_loop(actor, lambda core: core.engine.list_loras()))
        assert ids == {v + 1}, ids  # every older adapter dropped once no request held it; v (id v + 1) serves
    finally:
        actor.close()
        sender.close()
