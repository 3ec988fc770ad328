"""`launch.planning.memory_estimate`: the learner memory budget of the GPU-path review's appendix (Qwen2.5-7B on 8
ranks), worked out by hand, and the line a GPU run prints before it starts (none on CPU)."""

import json

import pytest

from configs.loading import resolve
from launch.planning.memory_estimate import aux_shapes, learner_memory, run_memory
from launch.planning.model_shape import ModelShape
from launch.planning.resources import Node, resolve_auto, start_lines

QWEN_7B = {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
           "vocab_size": 152064, "intermediate_size": 18944, "tie_word_embeddings": False,
           "max_position_embeddings": 32768}


def test_the_appendix_budget_of_qwen_7b_on_8_ranks():
    shape = ModelShape.from_config(QWEN_7B)
    p = 2 * 152064 * 3584 + 28 * 233_053_184 + 3584  # = 7_615_487_488 (q, k, v, o, MLP, 2 norms per layer)
    root = 2 * 152064 * 3584  # embedding + lm_head = 1_089_994_752
    m = learner_memory(shape, world=8, tokens=16384, chunk_tokens=4096, checkpointing=True)
    items = dict(m.every_rank + m.rank0_only + m.rank0_host)
    assert items["fp32 state"] == 16 * p / 8 == pytest.approx(15.23e9, rel=1e-3)  # appendix: 15.2 GB
    assert items["embedding/head"] == root * 2 == pytest.approx(2.18e9, rel=1e-3)  # 2.2 GB
    assert items["their grads"] == root * 6 == pytest.approx(6.54e9, rel=1e-3)  # 2.2 + 4.4 GB
    assert items["2 layers"] == 2 * 233_053_184 * 2  # 0.93 GB (0.5-1)
    assert items["activations"] == 16384 * (28 * 3584 * 2 + (4 * 3584 + 2 * 18944) * 2)  # 3.29 + 1.71 GB
    assert items["log-prob head"] == 4 * 4096 * 152064 * 4 == pytest.approx(9.97e9, rel=1e-3)  # 7.5-10 GB
    # F10 (gpu_path_3): vLLM's producer holds one slot's packed bucket in flight while the other slot has the
    # next tensor's device copy and its torch.cat: 3 × the 1.09 GB embedding = 3.3 GB (2 × was counted)
    assert items["push staging"] == p * 2 and items["send buffers"] == 3 * 152064 * 3584 * 2  # 15.2, 3.3 GB
    # appendix: ≈ 57 GB in full mode (+ 1.1 GB for the producer's third copy), of which the 15.2 GB payload now
    # waits in pinned host memory
    assert m.total(rank0=True) + p * 2 == pytest.approx(58.4e9, rel=2e-3)
    assert m.total(rank0=True) == pytest.approx(43.2e9, rel=2e-3)
    assert m.total(rank0=True) - m.total(rank0=False) == 3 * 152064 * 3584 * 2  # only the send buffers: 3.3 GB
    delta = learner_memory(shape, world=8, tokens=16384, chunk_tokens=4096, checkpointing=True, delta=True)
    assert delta.total(rank0=True) == m.total(rank0=True)  # appendix: ≈ 72 GB, the baseline also in host memory
    # N2: pinned staging, exact-size buffers (weightsync.staging): the payload, and a delta's patch arena
    # as large again, + one 8 KiB page-alignment allowance for the arena: 30.5 GB, not torch's ~58 GB
    assert sum(b for _, b in delta.rank0_host) == 2 * p * 2 + 8192
    gpu_default = learner_memory(shape, world=8, tokens=16384, chunk_tokens=1024, checkpointing=True)
    assert m.total(True) - gpu_default.total(True) == 3 * 4 * 1024 * 152064 * 4  # the 1024 chunk saves 7.5 GB
    # C8: PURE's 7B PRM sharded like the reference: its eighth (1.9 GB) + its root unit whole while it
    # runs (embedding + head, 2.2 GB) = 4.1 GB per rank, no longer the whole 15.2 GB
    with_prm = learner_memory(shape, world=8, tokens=16384, chunk_tokens=4096, checkpointing=True, aux=(shape,))
    assert with_prm.total(True) - m.total(True) == p * 2 / 8 + root * 2 == pytest.approx(4.08e9, rel=1e-3)
    one_rank = learner_memory(shape, world=1, tokens=16384, chunk_tokens=4096, checkpointing=True, aux=(shape,),
                              reference=True)
    assert dict(one_rank.every_rank)["HF PRM"] == dict(one_rank.every_rank)["reference"] == p * 2  # unsharded


def test_a_gpu_run_prints_its_estimate_and_a_cpu_run_nothing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    cfg = resolve("grpo", overrides=[f"model.path={tmp_path}", "learner.world_size=8", "learner.batch_prompts=8"])
    gpu = resolve_auto(cfg, [Node("g", 96, 16, 1000)])
    (line,) = start_lines(gpu)
    assert line.startswith("[run] learner memory per rank (estimate): rank 0 ≈ ")
    # a user's model gets real-model limits (1,024 + 3,072 tokens): 32 rows × 4,096 > the 16,384-token cap
    assert (gpu.data.max_prompt_tokens, gpu.rollout.max_response_tokens, gpu.learner.micro_batch_samples) == (1024, 3072, 32)
    assert "(16,384-token micro-batches, log-prob chunk 1,024;" in line
    assert line.endswith("rank 0 stages each push in 15.2 GB of pinned host memory (full pushes)")
    assert start_lines(resolve_auto(cfg, [Node("m", 2, 0, 24)])) == []
    shared = resolve_auto(resolve("grpo", overrides=["rollout.gpus_per_actor=0.5",
                                                     "rollout.engine.gpu_memory_utilization=0.4"]),
                          [Node("g", 96, 8, 1000)])
    assert start_lines(shared)[0].startswith("[run] weight sync over gloo")  # A2's note; built-in model: no estimate


def test_the_hf_directories_an_algorithm_loads_count_sharded_on_every_rank(tmp_path):
    (tmp_path / "prm").mkdir()
    (tmp_path / "prm" / "config.json").write_text(json.dumps(QWEN_7B))
    pure = resolve("pure", overrides=["pure.prm=hf", f"pure.prm_path={tmp_path / 'prm'}"])
    assert aux_shapes(pure) == (ModelShape.from_config(QWEN_7B),)  # PURE's HF PRM (AlgoSpec.files: hf_dir)
    assert aux_shapes(resolve("grpo")) == ()  # names no HF directory
    (tmp_path / "prm" / "config.json").write_text("{")
    assert aux_shapes(pure) == ()  # unreadable: no estimate for it, no error before start


def test_the_reference_counts_when_the_algorithm_asks_for_it(tmp_path):
    """PURE's KL is pure.kl_coef, not loss.kl_coef: the estimate asks the algorithm (`requires`), as the
    learner does, whether a reference model is built."""
    shape = ModelShape.from_config(QWEN_7B)
    with_kl = resolve("pure", overrides=["pure.kl_coef=0.01", "loss.kl_coef=0"])
    assert "reference" in dict(run_memory(with_kl, shape).every_rank)
    assert "reference" not in dict(run_memory(resolve("pure", overrides=["pure.kl_coef=0"]), shape).every_rank)


def test_the_teacher_counts_sharded_like_the_reference(tmp_path):
    """--algo opd's teacher (teacher.path) is a frozen model on every rank: a 7B teacher of a 7B student on 8
    ranks adds its eighth in bf16 (7.615e9 × 2 / 8 = 1.9 GB) + its root unit whole while it runs (2 × 152064 ×
    3584 × 2 = 2.2 GB) = 4.1 GB per rank, as PURE's PRM does; without a teacher in the requirements, nothing."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    shape = ModelShape.from_config(QWEN_7B)
    p, root = 7_615_487_488, 2 * 152064 * 3584
    opd = resolve("opd", overrides=[f"teacher.path={tmp_path}", "learner.world_size=8", "learner.batch_prompts=8"])
    items = dict(run_memory(opd, shape).every_rank)
    assert items["teacher"] == p * 2 / 8 + root * 2 == pytest.approx(4.08e9, rel=1e-3)
    grpo = resolve("grpo", overrides=[f"teacher.path={tmp_path}"])  # set, but GRPO scores with no teacher
    assert "teacher" not in dict(run_memory(grpo, shape).every_rank)
    (tmp_path / "config.json").write_text("{")
    assert "teacher" not in dict(run_memory(opd, shape).every_rank)  # unreadable: preflight refuses it


def test_a_teacher_scored_on_its_engine_is_not_on_the_learner_ranks(tmp_path):
    # teacher.scoring=engine: the same 7B teacher costs the learner ranks nothing, and the start line says where
    # it runs (the line above, with it on the ranks, says so too)
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.json").write_text(json.dumps(QWEN_7B))
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    shape = ModelShape.from_config(QWEN_7B)
    base = ["learner.world_size=8", "learner.batch_prompts=8", f"model.path={tmp_path}",
            f"teacher.path={tmp_path / 'teacher'}"]
    ranks, engine = (resolve("opd", overrides=[*base, f"teacher.scoring={s}"]) for s in ("learner", "engine"))
    with_teacher, without = run_memory(ranks, shape), run_memory(engine, shape)
    assert "teacher" in dict(with_teacher.every_rank) and "teacher" not in dict(without.every_rank)
    assert with_teacher.total(True) - without.total(True) == pytest.approx(4.08e9, rel=1e-3)
    node = [Node("g", 96, 16, 1000)]
    assert start_lines(resolve_auto(ranks, node))[-1].endswith("the teacher runs on the learner ranks (counted above)")
    assert start_lines(resolve_auto(engine, node))[-1].endswith(
        "the teacher scores on its own vLLM engine in the driver (teacher.scoring=engine; on GPUs of its own on the "
        "driver's node), not on the learner ranks")


def test_a_lora_run_counts_a_frozen_base_and_the_adapters_only(tmp_path):
    shape = ModelShape.from_config(QWEN_7B)
    p = 7_615_487_488
    q = shape.lora_parameters(16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # per layer: q (3584+3584) + k, v 2 × (3584+512) + o (3584+3584) + gate, up 2 × (3584+18944) + down (18944+3584)
    assert q == 16 * 28 * 90112 == 40_370_176
    full = learner_memory(shape, world=1, tokens=16384, chunk_tokens=1024, checkpointing=True, reference=True)
    lora = learner_memory(shape, world=1, tokens=16384, chunk_tokens=1024, checkpointing=True, reference=True,
                          lora_params=q)
    lo = dict(lora.every_rank)
    assert lo["frozen fp32 base"] == 4 * p and lo["adapter state"] == 16 * q  # 30.5 GB + 0.65 GB
    assert "their grads" not in lo and "reference" not in lo  # frozen head; the reference is the adapter-off base
    # one GPU: 16 × P (121.8 GB) + head grads (6.5 GB) + a bf16 reference (15.2 GB) → 4 × P + 16 × Q
    assert full.total(True) - lora.total(True) == pytest.approx(12 * p + 1_089_994_752 * 6 + 2 * p - 16 * q)
    # 30.46 base + 0.65 adapters + 2.18 head + 0.93 two layers + 5.00 activations + 2.49 log-prob head + 3.27 send
    # (send buffers: (PRODUCER_SLOTS + 1) = 3 × the largest tensor, 152064 × 3584 × 2 B = 1.09 GB each)
    assert lora.total(True) == pytest.approx(44.98e9, rel=1e-3)
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    cfg = resolve("grpo", overrides=[f"model.path={tmp_path}", "model.lora.rank=16"])
    run = run_memory(resolve_auto(cfg, [Node("g", 96, 16, 1000)]), shape)
    assert dict(run.every_rank)["adapter state"] == 16 * q
    # adapter pushes (model.lora.sync: adapter, the default) stage Q × 2 bytes = 80.7 MB, not P × 2 = 15.2 GB
    assert dict(run.rank0_host)["push staging"] == q * 2
    (line,) = start_lines(resolve_auto(cfg, [Node("g", 96, 16, 1000)]))
    assert "LoRA rank 16: 40.4 M adapter parameters train, the base is frozen" in line
    assert line.endswith("rank 0 stages each push in 0.1 GB of pinned host memory (adapter pushes)")
    merged = resolve_auto(resolve("grpo", overrides=[f"model.path={tmp_path}", "model.lora.rank=16",
                                                     "model.lora.sync=merged"]), [Node("g", 96, 16, 1000)])
    assert dict(run_memory(merged, shape).rank0_host)["push staging"] == pytest.approx(p * 2, rel=1e-3)
