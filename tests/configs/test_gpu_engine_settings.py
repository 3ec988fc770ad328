"""Engine settings a GPU run gets from its own figures rather than vLLM's or the CPU's defaults (review gpu_path_3
F2, F4, F5): pushes that keep the salted prefix cache on GPU engines, the scheduler's token budget per step, the
credit window that grows with the actors, and the planner's count of the actors one learner can feed. Pure
functions of the config; the CPU values stay as they were."""

from __future__ import annotations

from configs.loading import resolve
from launch.planning.resources import Node, resolve_auto


def gpu_nodes(count: int) -> list[Node]:
    return [Node(f"10.0.0.{i + 1}", 96, 8, 1000) for i in range(count)]


CPU = [Node("this machine", 2, 0, 24)]


# ---------------------------------------------------------------------------- F2: clear_cache
def test_pushes_keep_the_salted_cache_on_gpu_engines_and_drop_it_on_cpu():
    """A push that drops the KV cache re-prefills every sequence in flight: ~3-4 s of each 7B engine's time per
    push with MATH-like lengths, ~15-20 s with long reasoning (review F2). GPU engines keep the cache (requests
    salted by weight version); CPU engines keep the behaviour measured there."""
    cfg = resolve("grpo")
    assert cfg.weight_sync.clear_cache == "auto"
    assert resolve_auto(cfg, gpu_nodes(1)).weight_sync.clear_cache is False
    assert resolve_auto(cfg, CPU).weight_sync.clear_cache is True
    assert cfg.weight_sync.resolved_clear_cache(gpu=True) is False
    assert cfg.weight_sync.resolved_clear_cache(gpu=False) is True
    said = resolve("grpo", overrides=["weight_sync.clear_cache=true"])
    assert resolve_auto(said, gpu_nodes(1)).weight_sync.clear_cache is True  # what the user set stands


# ---------------------------------------------------------------------------- F4: max_num_batched_tokens
def users_model(tmp_path, context: int = 4096):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(f'{{"max_position_embeddings": {context}}}')
    return model


def test_gpu_engines_of_a_users_model_schedule_8192_tokens_a_step(tmp_path):
    """vLLM's AsyncLLM (UsageContext.ENGINE_CONTEXT) falls back to SchedulerConfig's 2048 tokens a step: with
    chunked prefill, new prompts and re-prefills went through in 2048-token slices. The real-model preset sets
    8192: veRL's rollout default and vLLM 0.32's own OpenAI-server default on H100/H200-class GPUs."""
    from actors.engine import EngineSpec

    model = users_model(tmp_path)
    cfg = resolve("grpo", overrides=[f"model.path={model}"])
    assert cfg.rollout.engine.max_num_batched_tokens == 8192
    gpu = EngineSpec.from_config(cfg, model, weight_transfer=False, cpu=False).engine_args_kwargs()
    assert gpu["max_num_batched_tokens"] == 8192 and "enable_chunked_prefill" not in gpu
    cpu = EngineSpec.from_config(cfg, model, weight_transfer=False, cpu=True).engine_args_kwargs()
    assert cpu["max_num_batched_tokens"] == 8192 and cpu["enable_chunked_prefill"] is False
    mine = resolve("grpo", overrides=[f"model.path={model}", "rollout.engine.max_num_batched_tokens=16384"])
    assert EngineSpec.from_config(mine, model, weight_transfer=False, cpu=False).engine_args_kwargs()[
        "max_num_batched_tokens"] == 16384


def test_a_cpu_engine_still_fits_a_whole_context_in_one_step(tmp_path):
    """Chunked prefill is off on CPU (actors.engine): the step budget must hold the longest context, whatever
    the setting says. The tiny model keeps its values (null: vLLM's on GPUs, a whole context on CPU)."""
    from actors.engine import EngineSpec

    model = users_model(tmp_path, context=16384)
    long = resolve("grpo", overrides=[f"model.path={model}", "rollout.max_response_tokens=12000"])
    assert EngineSpec.from_config(long, model, weight_transfer=False, cpu=True).engine_args_kwargs()[
        "max_num_batched_tokens"] == 1024 + 12000
    tiny = resolve("grpo")
    assert tiny.rollout.engine.max_num_batched_tokens is None
    assert "max_num_batched_tokens" not in EngineSpec.from_config(tiny, model, weight_transfer=False,
                                                                  cpu=False).engine_args_kwargs()
    assert EngineSpec.from_config(tiny, model, weight_transfer=False, cpu=True).engine_args_kwargs()[
        "max_num_batched_tokens"] == 4096  # max(256 + 128, 4096), as before


# ---------------------------------------------------------------------------- F5: credit that grows with the actors
def test_the_buffers_capacity_grows_with_the_actors_unless_set():
    """W = min((K + 1) × batch_prompts, buffer.capacity_groups). A fixed 256 groups gave each of 32 actors at
    most 8 prompts (64 sequences at n 8, ~29 % of the ~223 a 7B engine holds on an 80 GB GPU). auto keeps
    ACTOR_CREDIT_GROUPS = 32 prompts of room per actor (223 // 8 = 27 prompts fill such an engine), and never less
    than the 256 of before: 1 to 8 actors are unchanged."""
    from configs.buffer_section import ACTOR_CREDIT_GROUPS
    from configs.concurrency import credit_share, credit_window

    assert ACTOR_CREDIT_GROUPS == 32
    assert resolve("grpo").buffer.capacity_groups == 256  # 1 actor: max(256, 32 × 1)
    assert resolve("pure", flags={"rollout.num_actors": 8}).buffer.capacity_groups == 256  # 32 × 8
    big = resolve("pure", flags={"rollout.num_actors": 32}, overrides=["learner.batch_prompts=64"])
    assert big.buffer.capacity_groups == 32 * 32 == 1024
    assert credit_window(big) == (4 + 1) * 64 == 320 and credit_share(big, 32) == 10  # the batch is the limit now
    mine = resolve("pure", flags={"rollout.num_actors": 32}, overrides=["buffer.capacity_groups=256"])
    assert mine.buffer.capacity_groups == 256  # what the user set stands
