"""The planner's count of the actors one learner can feed (`launch.planning.feed_rate`, review gpu_path_3 F5), with
the arithmetic shown: Qwen2.5-7B's shape, PURE's batch 64 × 8, H100 learner ranks and engines."""

from __future__ import annotations

import json

import pytest

from configs.loading import resolve
from launch.planning.feed_rate import actors_fed, engine_tokens_per_s, feed_note, learner_tokens_per_s
from launch.planning.model_shape import ModelShape
from launch.planning.resources import Node, plan, resolve_auto
from tests.launch.test_memory_estimate import QWEN_7B

H100 = [Node("10.0.0.1", 96, 8, 1000, {"learner_node": 8, "accelerator_type:H100": 1}),
        Node("10.0.0.2", 96, 8, 1000, {"actor_node": 8, "accelerator_type:H100": 1})]
PIN = ["rollout.custom_resources={actor_node: 1}", "learner.custom_resources={learner_node: 1}",
       "learner.batch_prompts=64", "rollout.n=8"]


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**QWEN_7B, "max_position_embeddings": 4096}))
    return tmp_path


def run(model, actors: int, *overrides: str):
    return resolve("pure", flags={"model.path": str(model), "rollout.num_actors": actors, "learner.world_size": 8},
                   overrides=[*PIN, *overrides])


def test_the_formula_on_a_7b(model):
    cfg = resolve_auto(run(model, 8), H100)
    shape = ModelShape.read(model)
    # T_L = 8 ranks × 756e12 FLOP/s × 0.35 / (2 × 4 passes (checkpointing) × 7,615,487,488) = 34,745 tokens/s
    t_l = learner_tokens_per_s(cfg, shape, 756e12)
    assert t_l == pytest.approx(8 * 756e12 * 0.35 / (2 * 4 * 7_615_487_488)) == pytest.approx(34_745, rel=1e-4)
    # one step: 7,615,487,488 × 2 B + 216 × (1024 + 3072 / 2) × 57,344 B = 46,939,913,216 B at 2.0e12 × 0.6 B/s
    # = 0.039117 s; 216 tokens a step = 5,521.9 tokens/s
    t_e = engine_tokens_per_s(cfg, shape, 2.0e12, 216)
    assert t_e == pytest.approx(216 / (46_939_913_216 / 1.2e12)) == pytest.approx(5_521.9, rel=1e-4)
    # (34,745 / 4,096 tokens a sample) / (5,521.9 / 3,072 response tokens a sample) = 8.483 / 1.7975 = 4.72
    assert actors_fed(cfg, shape, t_l, t_e) == pytest.approx(4.72, abs=0.01)


def test_the_plan_says_how_many_actors_the_learner_feeds_and_warns_at_many_more(model):
    notes = plan(run(model, 8), H100, joined=True).notes
    (line,) = [n for n in notes if n.startswith("[plan] the learner can feed")]
    assert line == ("[plan] the learner can feed about 4.7 actor(s) (estimate): 8 H100 rank(s) train ~35 k tokens/s, "
                    "one H100 engine decodes ~5.5 k tokens/s with 216 sequences in flight "
                    "(launch/planning/feed_rate.py states the formula); this run has 8")
    # 32 actors: the credit share is 10 prompts (80 sequences), the engines decode slower per engine (3.6 k
    # tokens/s) and the learner feeds ~7.3 of them; 32 > 3 × 7.3
    big = resolve_auto(run(model, 32), H100 * 3)
    said = feed_note(big, H100[:1], H100[1:], 32)
    assert said.endswith("this run asks for 32: more actors than that buy staleness headroom, not speed, and every "
                         "push pauses all of them — consider --actors 8 or a larger learner (learner.world_size)")
    assert "feed about 7.3 actor(s)" in said and "with 80 sequences in flight" in said


def test_nothing_is_said_without_gpu_types_or_on_cpu(model):
    bare = [Node(n.name, 96, 8, 1000, {k: v for k, v in n.custom.items() if "accel" not in k}) for n in H100]
    assert not [n for n in plan(run(model, 8), bare, joined=True).notes if "can feed" in n]
    cpu = resolve_auto(resolve("grpo", flags={"model.path": str(model)}), [Node("m", 2, 0, 24)])
    assert feed_note(cpu, H100, H100, 1) is None
