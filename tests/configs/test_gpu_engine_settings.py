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
