"""`rollout.prompts_in_flight: auto` (`configs.concurrency`): each engine's concurrency from its KV capacity
and the staleness credit, today's 16 on CPU, and the "mostly idle" warning with its fix."""

from __future__ import annotations

import pytest

from configs.concurrency import credit_share, credit_window, engine_load, engine_sequences
from configs.loading import ConfigError, resolve

# Qwen2.5-7B on one H100 (79 GiB, the smallest H100 in launch.planning.engine_load.GPU_GIB) at 0.85:
#   0.85 × 79 GiB − 7,615,487,488 params × 2 B (bf16 weights) − 4 GiB reserve = 52,575,821,209 B of KV,
#   / 57,344 B per token (2 × 28 layers × 4 KV heads × 128 × 2 B) = 916,849 tokens
H100_7B_KV = 916_849


def real(*overrides: str, actors: int = 8, **flags):
    return resolve("pure", flags={"model.path": "/models/q", "rollout.num_actors": actors, **flags},
                   overrides=list(overrides))


def test_the_credit_window_and_share():
    cfg = real()  # pure.yaml: batch 16, max_staleness auto (from 1, up to the cap 4), capacity 256 groups
    assert credit_window(cfg) == min((4 + 1) * 16, 256) == 80  # the largest K the run may reach
    assert credit_share(cfg, 8) == 10 and credit_share(cfg, 3) == 27  # ceil(80 / 3)
    fixed = real("buffer.max_staleness=2")  # a number: K = 2, max_staleness_auto off
    assert credit_window(fixed) == (2 + 1) * 16 == 48
    assert credit_window(real("learner.batch_prompts=64")) == 256  # (4 + 1) × 64 = 320, held to capacity_groups


def test_auto_sizes_a_gpu_engine_from_its_kv_cache_and_the_credit():
    # 916,849 KV tokens / (1,024 + 3,072) tokens per sequence = 223 sequences (max_num_seqs 1024 is no limit)
    assert engine_sequences(H100_7B_KV, 4096, 1024) == 223
    assert engine_sequences(H100_7B_KV, 4096, 128) == 128  # vLLM's AsyncLLM default would cap it
    assert engine_sequences(None, 4096, 1024) is None
    # the PURE paper's batch (64 prompts × 8): W = 256, 32 per actor; the cache holds 223 // 8 = 27 prompts
    load = engine_load(real("learner.batch_prompts=64", "rollout.n=8"), gpu=True, actors=8, kv_tokens=H100_7B_KV,
                       max_num_seqs=1024)
    assert (load.prompts, load.capacity, load.share) == (27, 223, 32)
    assert load.busy() == pytest.approx(27 * 8 / 223) and load.warning() is None  # 97 % busy
    # the credit caps it: batch 16, n 4 gives each of 8 actors 10 prompts although 223 // 4 = 55 would fit
    assert engine_load(real(), gpu=True, actors=8, kv_tokens=H100_7B_KV, max_num_seqs=1024).prompts == 10
    # an engine that did not say its KV tokens gets its credit share
    assert engine_load(real(), gpu=True, actors=8).prompts == 10


def test_auto_on_cpu_is_todays_value_and_a_number_is_kept():
    assert engine_load(real(), gpu=False, actors=1, kv_tokens=524_288, max_num_seqs=128).prompts == 16
    assert engine_load(real("rollout.prompts_in_flight=5"), gpu=True, actors=8, kv_tokens=H100_7B_KV).prompts == 5
    assert resolve("grpo").rollout.prompts_in_flight == 16  # the tiny model's YAMLs keep their measured value


def test_the_idle_warning_names_the_fix():
    # the docs' recipe before this change: PURE, batch 16, n 4, 8 actors on H100s
    load = engine_load(real(), gpu=True, actors=8, kv_tokens=H100_7B_KV, max_num_seqs=1024)
    found, fix = load.warning()
    assert found == ("each engine keeps at most 10 prompts × 4 = 40 sequences in flight, 18% of the 223 it holds: "
                     "the staleness credit W = min((4 + 1) × learner.batch_prompts 16, buffer.capacity_groups 256) = "
                     "80 groups, shared by 8 actors, gives each 10")
    # half the 223 is 112 sequences = ceil(111.5 / 4) = 28 prompts per engine: 8 × 28 = 224 groups of credit,
    # batch ceil(224 / 5) = 45; or 80 // 28 = 2 actors sharing today's W
    assert fix == ("raise learner.batch_prompts to 45 or run 2 actors (--actors 2) (each engine then keeps ≥ 28 "
                   "prompts in flight)")
    # 32 actors need 32 × 28 = 896 groups: within capacity_groups auto (32 × 32 = 1024), so only the batch falls short
    _, fix = engine_load(real(actors=32), gpu=True, actors=32, kv_tokens=H100_7B_KV, max_num_seqs=1024).warning()
    assert fix.startswith("raise learner.batch_prompts to 180 or run 2 actors")
    # a capacity set to 256 is past: the fix raises it too
    _, fix = engine_load(real("buffer.capacity_groups=256", actors=32), gpu=True, actors=32, kv_tokens=H100_7B_KV,
                         max_num_seqs=1024).warning()
    assert fix.startswith("raise learner.batch_prompts to 180 and buffer.capacity_groups to 896 or run 2 actors")
    # the buffer's capacity is the limit: W = min(5 × 64, 64) = 64, 8 each; a batch of 45 would do, 64 is one
    _, fix = engine_load(real("learner.batch_prompts=64", "buffer.capacity_groups=64"), gpu=True, actors=8,
                         kv_tokens=H100_7B_KV, max_num_seqs=1024).warning()
    assert fix.startswith("raise buffer.capacity_groups to 224 or run 2 actors (--actors 2)")
    # a fixed prompts_in_flight below the share is the limit: auto is the fix
    found, fix = engine_load(real("learner.batch_prompts=64", "rollout.prompts_in_flight=8"), gpu=True, actors=8,
                             kv_tokens=H100_7B_KV, max_num_seqs=1024).warning()
    assert found.endswith("(rollout.prompts_in_flight=8)") and fix == "set rollout.prompts_in_flight=auto (up to 32 here)"
    # CPU engines are bound by their cores, not their cache: never "idle"
    assert engine_load(real(), gpu=False, actors=8, kv_tokens=H100_7B_KV).warning() is None


def test_prompts_in_flight_takes_auto_or_a_count():
    for value in ("auto", 1):
        assert resolve("grpo", overrides=[f"rollout.prompts_in_flight={value}"]).rollout.prompts_in_flight == value
    for value in ("0", "lots", "2.5", "true"):  # one line each, naming the key (not one per member of the type)
        with pytest.raises(ConfigError) as e:
            resolve("grpo", overrides=[f"rollout.prompts_in_flight={value}"])
        assert str(e.value).splitlines()[1].startswith("  rollout.prompts_in_flight: expects 'auto' or a whole number")
