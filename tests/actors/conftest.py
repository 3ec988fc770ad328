"""Shared rig of the actor tests: one tiny model, ONE vLLM engine for the whole folder (starting one
costs ~40 s on 2 cores), real buffer service processes, and actors attached to the shared engine.

Every process started here is stopped in teardown: the engine (EngineHost.close), buffer processes
(terminate, then kill), actors (close)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

N_PROMPTS = 24
MAX_PROMPT_TOKENS = 48
MAX_RESPONSE_TOKENS = 24
MAX_MODEL_LEN = 320


def run_config(**sets):
    """A small RunConfig: n=4 samples, 24-token responses, 4 prompts in flight; `sets` are dotted keys."""
    from configs.schema import RunConfig

    cfg = RunConfig()
    cfg.rollout.n = 4
    cfg.rollout.max_response_tokens = MAX_RESPONSE_TOKENS
    cfg.rollout.prompts_in_flight = 4
    cfg.rollout.num_actors = 1
    cfg.data.max_prompt_tokens = MAX_PROMPT_TOKENS
    cfg.learner.batch_prompts = 4
    cfg.weight_sync.backend = "gloo"  # what the launch resolves "auto" to on CPUs (launch.planning.resources)
    for key, value in sets.items():
        *path, last = key.split("__")
        obj = cfg
        for p in path:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return cfg


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from tasks.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("actors") / "tiny"))


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from actors.prompts import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def records():
    from tasks.arithmetic import sample_problems
    from tasks.demos import demonstration_records

    return demonstration_records(sample_problems(N_PROMPTS, split="train", seed=0), error_rate=0.0, seed=0)


@pytest.fixture(scope="session")
def prompts(records, tokenizer):
    from actors.prompts import items_from_records

    items, skipped = items_from_records(records, tokenizer, MAX_PROMPT_TOKENS)
    assert not skipped
    return items


@pytest.fixture(scope="session")
def demos(records, tokenizer) -> dict[int, np.ndarray]:
    """Teacher tokens per prompt_index, stored with their eos (as the learner loads them)."""
    eos = tokenizer.eos_token_id
    return {i: np.asarray(tokenizer.encode(r.target, add_special_tokens=False) + [eos], dtype=np.int32)
            for i, r in enumerate(records)}


@pytest.fixture(scope="session")
def host(model_dir):
    """The one engine of this folder (weight transfer enabled so the weight-update test can use it)."""
    from actors.engine import EngineSpec
    from actors.host import EngineHost

    cfg = run_config()
    # room for the longest test (prompt + 200-token responses); all actors of the folder share it
    h = EngineHost(EngineSpec.from_config(cfg, model_dir, 0, max_model_len=MAX_MODEL_LEN), name="test-engine")
    try:
        h.start()
        yield h
    finally:
        h.close()


class Buffers:
    """Starts buffer service processes and guarantees they are gone after the test."""

    def __init__(self):
        self.procs = []

    def start(self, cfg, **overrides):
        from buffer.process import start_buffer_process

        proc, address = start_buffer_process(cfg, **overrides)
        self.procs.append(proc)
        return proc, address

    def stop_all(self):
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)


@pytest.fixture
def buffers():
    b = Buffers()
    try:
        yield b
    finally:
        b.stop_all()


@pytest.fixture
def make_actor(host, model_dir, prompts):
    """Factory of RolloutActors on the shared engine; all are closed after the test."""
    from actors.actor import RolloutActor

    made = []

    def make(cfg, address, **kwargs):
        a = RolloutActor(cfg, 0, model_dir, address, kwargs.pop("prompts", prompts), host=host, **kwargs)
        made.append(a)
        a.start()
        return a

    try:
        yield make
    finally:
        for a in made:
            a.close()


@pytest.fixture
def learner_client():
    """Factory of BufferClients (the learner side); closed after the test."""
    from buffer.client import BufferClient

    made = []

    def make(address, timeout_s=10.0):
        c = BufferClient(address, f"learner-{len(made)}", timeout_s=timeout_s)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
