"""`algo-train doctor`'s checks as pure functions: each turns what it found into a row, and each can fail
with the right fix. The end-to-end command (Ray, the weight path) is tested in tests/e2e/test_doctor_e2e.py."""

import json

import pytest

from configs.loading import resolve
from launch.doctor.checks import config_checks, facts_checks, kv_checks, learner_estimate, memory_row
from launch.doctor.report import Check, table
from launch.planning.model_shape import ModelShape, context_problem

# Qwen2.5-7B's config.json (the fields read)
QWEN_7B = dict(num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
               vocab_size=152064, intermediate_size=18944, max_position_embeddings=4096, tie_word_embeddings=False)
GIB = 2**30


def test_model_shape_arithmetic():
    s = ModelShape.from_config(QWEN_7B)
    assert s.head_dim == 3584 // 28 == 128
    assert s.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57344  # K and V × layers × KV heads × head_dim × bf16
    assert s.kv_tokens(GIB, 2) == 2**30 // 57344 == 18724
    # 2 × 152064 × 3584 (embedding + head) + 28 × (3584·3584 + 2·3584·512 + 3584·3584 + 3·3584·18944 + 2·3584) + 3584
    assert s.parameters() == 2 * 152064 * 3584 + 28 * 233_053_184 + 3584 == 7_615_487_488
    assert ModelShape.from_config({"text_config": QWEN_7B}) == s


def test_context_refusal_names_the_fix():
    s = ModelShape.from_config(QWEN_7B)
    assert context_problem(s, 1024, 3072, "m") is None  # 4096 fits exactly
    msg = context_problem(s, 1024, 4096, "/models/q")
    assert "= 5120 tokens, but /models/q has a context of 4096" in msg
    assert msg.endswith("(e.g. --set rollout.max_response_tokens=3072)")


def test_kv_cache_rows():
    s = ModelShape.from_config(QWEN_7B)
    cfg = resolve("grpo", overrides=["model.path=/models/q", "data.max_prompt_tokens=1024", "rollout.max_response_tokens=3072",
                                     "rollout.prompts_in_flight=8"])
    # CPU engine, 1 GiB, model.dtype auto (float32 on a CPU engine: 2 × 28 × 4 × 128 × 4 B = 114,688 B per
    # token; N8: the check passed the string "cpu" as `gpu` and counted bf16): 2**30 // 114688 = 9,362
    # tokens ≥ one 4,096-token sequence, < 8 prompts × 8 samples × 4,096 in flight
    row = kv_checks(cfg, s, "10.0.0.2", None)[0]
    assert row.status == "WARN" and "9,362 KV tokens per engine" in row.found and "114,688 B/token" in row.found
    assert "lower rollout.prompts_in_flight to 1" in row.fix  # max(1, 9362 // (8 samples × 4096))
    cfg.rollout.max_response_tokens = 30000
    assert kv_checks(cfg, s, "10.0.0.2", None)[0].status == "FAIL"
    # a GPU engine at 0.85 of 80 GiB: 0.85·80 GiB − 7.615 B × 2 B − 4 GiB = 49.8 GiB → 932,000+ tokens
    cfg.rollout.max_response_tokens = 3072
    cfg.rollout.engine.gpu_memory_utilization = 0.85
    row = kv_checks(cfg, s, "10.0.0.2", 80 * GIB)[0]
    tokens = int((0.85 * 80 * GIB - 7_615_487_488 * 2 - 4 * GIB) // 57344)
    assert f"{tokens:,} KV tokens" in row.found and row.status == "PASS"


def test_a_gpu_engine_the_credit_leaves_idle_is_a_warn_row_and_auto_concurrency_is_resolved():
    # prompts_in_flight: auto (a user's model) is sized as the run sizes it; with 8 actors sharing the credit
    # of learner.batch_prompts=16, n=4, each engine keeps ≤ ceil(W/8) prompts × 4 sequences of the ~220
    # 4,096-token sequences an 80 GiB H100 engine holds: under half busy, a WARN naming the fix
    s = ModelShape.from_config(QWEN_7B)
    base = ["model.path=/models/q", "data.max_prompt_tokens=1024", "rollout.max_response_tokens=3072",
            "rollout.gpus_per_actor=1", "rollout.engine.gpu_memory_utilization=0.85", "rollout.num_actors=8"]
    cfg = resolve("grpo", overrides=[*base, "learner.batch_prompts=16", "rollout.n=4"])
    assert cfg.rollout.prompts_in_flight == "auto"
    kv, load = kv_checks(cfg, s, "10.0.0.2", 80 * GIB)
    assert kv.status == "PASS" and " prompts × 4 samples in flight" in kv.found
    assert load.name == "engine load" and load.status == "WARN" and "learner.batch_prompts" in load.fix, load
    busy = resolve("grpo", overrides=[*base, "learner.batch_prompts=64", "rollout.n=8"])
    assert [c.name for c in kv_checks(busy, s, "10.0.0.2", 80 * GIB)] == ["kv cache"]  # the recipe's batch: busy
    assert [c.name for c in kv_checks(cfg, s, "10.0.0.2", None)] == ["kv cache"]  # CPU engines: no load row


P = 7_615_487_488  # Qwen2.5-7B's parameters (test_model_shape_arithmetic)
ROOT = 2 * 152064 * 3584  # its embedding + lm_head


def _pure_7b(tmp_path, *more):
    """PURE on Qwen2.5-7B with a 7B PRM, 8 learner ranks, a KL term (so a reference model), 4 rows of 4,096."""
    (tmp_path / "prm").mkdir(parents=True)
    (tmp_path / "prm" / "config.json").write_text(json.dumps(QWEN_7B))
    return resolve("pure", overrides=["model.path=/models/q", "learner.world_size=8", "learner.micro_batch_samples=4",
                                      "data.max_prompt_tokens=1024", "rollout.max_response_tokens=3072",
                                      "pure.prm=hf", f"pure.prm_path={tmp_path / 'prm'}", "pure.kl_coef=0.01",
                                      *more])


def test_the_doctor_counts_what_the_start_line_counts_with_measured_activations(tmp_path):
    """N8: the doctor counted the sharded state and the measured activations only. It now takes every
    other item from the start line's estimate (`run_memory`): the root unit and its gradients, the
    prefetched layers, the log-prob head chunk, the reference model, PURE's PRM (each sharded over 8
    ranks plus its root unit), rank 0's send buffers; bf16 weights on the GPU (d = 2)."""
    s = ModelShape.from_config(QWEN_7B)
    cfg = _pure_7b(tmp_path, "learner.activation_checkpointing=false")
    probe = {"per_layer_token_bytes": 200_000.0, "head_token_bytes": 50_000.0, "device": "cuda"}
    m, how = learner_estimate(cfg, s, probe, gpu=True)
    tokens = 4 * 4096  # micro_batch_samples × (prompt + response), = the 16,384-token GPU cap
    acts = tokens * (50_000 + 28 * 200_000)
    items = dict(m.every_rank + m.rank0_only)
    layer = (P - ROOT - 3584) / 28
    frozen = P * 2 / 8 + ROOT * 2  # an eighth of a 7B + its embedding and head whole while it runs: 4.08 GB
    assert items == {"fp32 state": 16 * P / 8, "embedding/head": ROOT * 2, "their grads": ROOT * 6,
                     "2 layers": 2 * layer * 2, "activations": acts, "log-prob head": 4 * 1024 * 152064 * 4,
                     "reference": frozen, "HF PRM": frozen, "send buffers": 3 * 152064 * 3584 * 2}
    old = acts + 16 * P / 8  # what the doctor counted before
    assert m.total(rank0=True) - old == ROOT * 8 + 2 * layer * 2 + 4 * 1024 * 152064 * 4 + 2 * frozen + ROOT * 3
    # 8.72 + 0.93 + 2.49 + 2 × 4.08 + 3.27 (send buffers: 3 × the 1.09 GB embedding) = 23.6 GB left out (the
    # review's 25-30 GB: chunk 4096, a whole PRM)
    assert m.total(rank0=True) - old == pytest.approx(23.58e9, rel=1e-3)
    assert "micro-batch 16,384 tokens × 28 layers" in how and "reference 3.80" in how  # 4.08e9 B = 3.80 GiB
    cfg.learner.activation_checkpointing = True  # a layer keeps its bf16 input: 3584 × 2 B per token
    m, how = learner_estimate(cfg, s, probe, gpu=True)
    assert dict(m.every_rank)["activations"] == tokens * (50_000 + 28 * 3584 * 2 + 200_000)
    assert "(checkpointed)" in how
    cpu = _pure_7b(tmp_path / "cpu", "learner.activation_checkpointing=true")  # model.dtype auto: fp32 on CPU
    m, _ = learner_estimate(cpu, s, probe, gpu=False)  # N8: a CPU learner with dtype auto counted bf16
    assert dict(m.every_rank)["embedding/head"] == ROOT * 4
    assert dict(m.every_rank)["activations"] == tokens * (50_000 + 28 * 3584 * 4 + 200_000)  # no cap on CPU


def test_the_learner_memory_row_fails_where_the_start_line_would_not_fit_and_on_pinned_staging(tmp_path):
    """A 40 GiB GPU (0.9 × 40 GiB = 38.7 GB usable): the old count (state 15.2 + activations 5.7 GB) passed,
    the whole budget (≈ 43.5 GB with the PRM and the reference) fails. Pinned staging: 2 × 15.2 GB in
    delta mode against half of a 48 GiB node fails, naming weight_sync.mode=full."""
    s = ModelShape.from_config(QWEN_7B)
    probe = {"per_layer_token_bytes": 100_000.0, "head_token_bytes": 50_000.0, "device": "cuda"}
    m, how = learner_estimate(_pure_7b(tmp_path), s, probe, gpu=True)  # checkpointing auto: on (GPU)
    acts = 4 * 4096 * (50_000 + 28 * 3584 * 2 + 100_000)
    assert acts + 16 * P / 8 < 0.9 * 40 * GIB < m.total(rank0=True)
    row = memory_row(m, how, 40 * GIB, 512 * GIB, "full")
    assert row.status == "FAIL" and "of 40 GiB" in row.found and row.fix.startswith("set learner.micro_batch_tokens")
    assert "and 14.2 GiB of pinned host memory for the push in flight (full pushes) of the node's 512 GiB" in row.found
    assert memory_row(m, how, 80 * GIB, 512 * GIB, "full").status == "PASS"
    delta, how = learner_estimate(_pure_7b(tmp_path / "d", "weight_sync.mode=delta"), s, probe, gpu=True)
    row = memory_row(delta, how, 80 * GIB, 48 * GIB, "delta")  # 30.5 GB = 28.4 GiB > 24 GiB
    assert row.status == "FAIL" and row.fix.startswith("set weight_sync.mode=full (half the pinned staging)")
    assert memory_row(delta, how, 80 * GIB, 64 * GIB, "delta").status == "PASS"


def _facts(**over):
    f = {"versions": {"torch": "2.13.0", "ray": "2.60.0", "transformers": "5.19.0", "vllm": "0.32.0"},
         "shared": True, "missing": [], "ifaces": {"GLOO_SOCKET_IFNAME": ("eth1", True),
                                                    "NCCL_SOCKET_IFNAME": ("eth1", True)}, "gpu_bytes": []}
    return f | over


def test_node_rows_fail_with_the_fix():
    driver = _facts()
    rows = {c.name: c for c in facts_checks("10.0.0.2", _facts(), driver, cluster=True, gpus=True, learner_ranks=2)}
    assert [r.status for r in rows.values()] == ["PASS", "PASS", "PASS"]
    bad = _facts(versions=driver["versions"] | {"vllm": "0.33.0"})
    row = facts_checks("n", bad, driver, True, True, 2)[0]
    assert row.status == "FAIL" and "install vllm==0.32.0" in row.fix
    row = facts_checks("n", _facts(versions=driver["versions"] | {"torch": "2.12.0"}), driver, True, True, 2)[0]
    assert row.status == "FAIL" and "torch 2.12.0 (driver 2.13.0)" in row.found
    row = facts_checks("n", _facts(shared=False, missing=["/d.parquet"]), driver, True, True, 2)[1]
    assert row.status == "FAIL" and "missing: /d.parquet" in row.found and "filesystem every node mounts" in row.fix
    assert facts_checks("n", _facts(ifaces={}), driver, cluster=False, gpus=False, learner_ranks=2)[2].status == "PASS"


def test_interface_variables_matter_where_learner_ranks_span_nodes():
    """N1: a one-rank learner makes no sockets for its process group and the weight sync binds the
    learner node's address, so unset variables PASS with that reason (they WARNed on every cluster);
    they WARN for several learner ranks on a cluster, and a named interface the node lacks FAILs always."""
    driver = _facts()
    unset = _facts(ifaces={"GLOO_SOCKET_IFNAME": (None, None)})
    row = facts_checks("n", unset, driver, True, False, learner_ranks=1)[2]
    assert row.status == "PASS" and row.found.startswith("GLOO_SOCKET_IFNAME not set, not needed: one learner rank")
    row = facts_checks("n", unset, driver, True, False, learner_ranks=4)[2]
    assert row.status == "WARN" and "the 4 learner ranks' process group binds" in row.found
    assert row.fix.startswith("export GLOO_SOCKET_IFNAME=IFACE")
    row = facts_checks("n", unset, driver, True, True, learner_ranks=2)[2]  # a GPU node: NCCL's too
    assert row.found.startswith("GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME not set")
    for ranks in (1, 2):
        row = facts_checks("n", _facts(ifaces={"GLOO_SOCKET_IFNAME": ("eth9", False),
                                               "NCCL_SOCKET_IFNAME": ("eth1", True)}), driver, True, True, ranks)[2]
        assert row.status == "FAIL" and "GLOO_SOCKET_IFNAME=eth9" in row.found


def test_config_rows_and_table():
    s = ModelShape.from_config(QWEN_7B)
    cfg = resolve("grpo", overrides=["model.path=/models/q", "data.max_prompt_tokens=1024", "rollout.max_response_tokens=4096"])
    rows = config_checks(cfg, s)
    assert rows[0].status == "FAIL" and rows[0].fix.startswith("lower them to fit")
    text = table(rows + [Check("10.0.0.2", "versions", "PASS", "ok")])
    assert text.splitlines()[0].split() == ["where", "check", "status", "found"]
    assert "fix: lower them to fit" in text
    assert text.splitlines()[-1] == "2 checks: 1 passed, 0 warned, 1 failed"


def test_the_resources_row_is_the_runs_own_plan_teacher_engines_included():
    from launch.doctor.checks import plan_check
    from launch.planning.cluster import ClusterInfo
    from launch.planning.resources import Node

    opd = resolve("opd", flags={"rollout.num_actors": 7},
                  overrides=["teacher.path=/models/t", "teacher.scoring=engine", "learner.batch_prompts=8"])
    head, worker = Node("10.0.0.1", 32, 8, 512), Node("10.0.0.2", 32, 8, 512)
    row = plan_check(opd, ClusterInfo("10.0.0.1:6379", "--ray-address", (head, worker), driver="10.0.0.1"))
    assert row.status == "PASS" and row.name == "resources"
    assert "1 teacher engine(s) × [1 GPU + 0 CPU + ~1.5 GiB] on the driver's node 10.0.0.1" in row.found
    # started on a CPU-only head: the teacher's engine has no GPU there; the row names the fix
    cpu_head = Node("10.0.0.9", 32, 0, 512)
    row = plan_check(opd, ClusterInfo("10.0.0.9:6379", "--ray-address", (cpu_head, worker), driver="10.0.0.9"))
    assert row.status == "FAIL" and "1 GPU needed, 0 free" in row.found
    assert row.fix.startswith("run algo-train on a node with 1 GPU(s) free for the teacher")
