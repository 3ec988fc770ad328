"""`algo-train doctor`'s checks as pure functions: each turns what it found into a row, and each can fail
with the right fix. The end-to-end command (Ray, the weight path) is tested in tests/e2e/test_doctor_e2e.py."""

from configs.loading import resolve
from launch.doctor.checks import config_checks, facts_checks, kv_check, learner_estimate
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
    cfg = resolve("grpo", overrides=["model.path=/models/q", "data.max_prompt_tokens=1024", "rollout.max_response_tokens=3072"])
    # CPU engine, 1 GiB: 18,724 tokens ≥ one 4,096-token sequence, < 8 prompts × 8 samples × 4,096 in flight
    row = kv_check(cfg, s, "10.0.0.2", None)
    assert row.status == "WARN" and "18,724 KV tokens per engine" in row.found
    assert "lower rollout.prompts_in_flight to 1" in row.fix  # max(1, 18724 // (8 samples × 4096))
    cfg.rollout.max_response_tokens = 30000
    assert kv_check(cfg, s, "10.0.0.2", None).status == "FAIL"
    # a GPU engine at 0.85 of 80 GiB: 0.85·80 GiB − 7.615 B × 2 B − 4 GiB = 49.8 GiB → 932,000+ tokens
    cfg.rollout.max_response_tokens = 3072
    cfg.rollout.engine.gpu_memory_utilization = 0.85
    row = kv_check(cfg, s, "10.0.0.2", 80 * GIB)
    tokens = int((0.85 * 80 * GIB - 7_615_487_488 * 2 - 4 * GIB) // 57344)
    assert f"{tokens:,} KV tokens" in row.found and row.status == "PASS"


def test_learner_estimate_arithmetic():
    s = ModelShape.from_config(QWEN_7B)
    cfg = resolve("grpo", overrides=["model.path=/models/q", "learner.world_size=8", "learner.micro_batch_samples=4",
                                     "data.max_prompt_tokens=1024", "rollout.max_response_tokens=3072",
                                     "learner.activation_checkpointing=false"])
    probe = {"per_layer_token_bytes": 200_000.0, "head_token_bytes": 50_000.0, "device": "cuda"}
    need, how = learner_estimate(cfg, s, probe, gpu=True)
    tokens = 4 * 4096  # micro_batch_samples × (prompt + response)
    assert need == tokens * (50_000 + 28 * 200_000) + 16 * 7_615_487_488 / 8
    assert "micro-batch 16,384 tokens × 28 layers" in how
    cfg.learner.activation_checkpointing = True  # a layer keeps its bf16 input: 3584 × 2 B per token
    need, how = learner_estimate(cfg, s, probe, gpu=True)
    assert need == tokens * (50_000 + 28 * 3584 * 2 + 200_000) + 16 * 7_615_487_488 / 8
    assert "(checkpointed)" in how


def _facts(**over):
    f = {"versions": {"torch": "2.13.0", "ray": "2.60.0", "transformers": "5.19.0", "vllm": "0.32.0"},
         "shared": True, "missing": [], "ifaces": {"GLOO_SOCKET_IFNAME": ("eth1", True),
                                                    "NCCL_SOCKET_IFNAME": ("eth1", True)}, "gpu_bytes": []}
    return f | over


def test_node_rows_fail_with_the_fix():
    driver = _facts()
    rows = {c.name: c for c in facts_checks("10.0.0.2", _facts(), driver, cluster=True, gpus=True)}
    assert [r.status for r in rows.values()] == ["PASS", "PASS", "PASS"]
    bad = _facts(versions=driver["versions"] | {"vllm": "0.33.0"})
    row = facts_checks("n", bad, driver, True, True)[0]
    assert row.status == "FAIL" and "install vllm==0.32.0" in row.fix
    row = facts_checks("n", _facts(versions=driver["versions"] | {"torch": "2.12.0"}), driver, True, True)[0]
    assert row.status == "FAIL" and "torch 2.12.0 (driver 2.13.0)" in row.found
    row = facts_checks("n", _facts(shared=False, missing=["/d.parquet"]), driver, True, True)[1]
    assert row.status == "FAIL" and "missing: /d.parquet" in row.found and "filesystem every node mounts" in row.fix
    row = facts_checks("n", _facts(ifaces={"GLOO_SOCKET_IFNAME": ("eth9", False),
                                           "NCCL_SOCKET_IFNAME": ("eth1", True)}), driver, True, True)[2]
    assert row.status == "FAIL" and "GLOO_SOCKET_IFNAME=eth9" in row.found
    row = facts_checks("n", _facts(ifaces={"GLOO_SOCKET_IFNAME": (None, None)}), driver, True, False)[2]
    assert row.status == "WARN" and row.fix.startswith("export GLOO_SOCKET_IFNAME=IFACE")
    assert facts_checks("n", _facts(ifaces={}), driver, cluster=False, gpus=False)[2].status == "PASS"


def test_config_rows_and_table():
    s = ModelShape.from_config(QWEN_7B)
    cfg = resolve("grpo", overrides=["model.path=/models/q", "data.max_prompt_tokens=1024", "rollout.max_response_tokens=4096"])
    rows = config_checks(cfg, s)
    assert rows[0].status == "FAIL" and rows[0].fix.startswith("lower them to fit")
    text = table(rows + [Check("10.0.0.2", "versions", "PASS", "ok")])
    assert text.splitlines()[0].split() == ["where", "check", "status", "found"]
    assert "fix: lower them to fit" in text
    assert text.splitlines()[-1] == "2 checks: 1 passed, 0 warned, 1 failed"
