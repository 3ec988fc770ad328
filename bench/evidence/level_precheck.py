"""The level pre-checks of issue 43's studies that train on a level past the warm model, run before any of their
runs: each study's precondition (`evidence_studies.PRECONDITION`) on the warm model the study starts from, with
the study's own config (its testbed's yaml, its common overrides, seed 0's warm model) and sampling
(rollout.temperature, top-p, top-k, max_response_tokens), on one vLLM engine:

    steps-credit         mean sampled accuracy of `--prompts` training prompts in [0.05, 0.15] (the RLOO arm's
                         train accuracy at step 0; mean@K estimates it at any n); re-registered from
                         [0.10, 0.15], which no level of the warm model reaches
    steps-luffy-beyond5  held-out pass@8 in (0, 0.05]
    steps-pacs5          held-out pass@64 in (0, 0.9) (the precondition's other half, GRPO's answer-token entropy
                         falling, is read from the study's own runs)

`--set KEY=VALUE ...` adds overrides after the study's own, to pre-check a candidate level before it is
registered. `--samples` (64) samples per prompt: pass@k by the unbiased estimator of `launch.commands.evaluate`. Prints
one JSON line per study with the figures and PASS or FAIL, and exits 1 when any fails.

    .venv/bin/python bench/evidence/level_precheck.py --study steps-credit steps-luffy-beyond5 steps-pacs5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECKS = {  # study -> (split, metric, passes)
    "steps-credit": ("train", "accuracy", lambda x: 0.05 <= x <= 0.15),
    "steps-luffy-beyond5": ("held_out", "pass@8", lambda x: 0.0 < x <= 0.05),
    "steps-pacs5": ("held_out", "pass@64", lambda x: 0.0 < x < 0.9),  # 0: nothing to learn (re-registered)
}


def study_config(name: str, extra: tuple[str, ...] = (), arm: str | None = None, seed: int = 0):
    """The RunConfig of the study's `arm` (None: its baseline) at `seed`, as `evidence.py` would start it, then
    the overrides `extra`."""
    from bench.evidence.evidence_studies import STUDIES, config_file, run_overrides
    from configs.loading import resolve

    study = STUDIES[name]
    chosen = next(a for a in study.arms if a.name == (arm or study.baseline))
    return resolve(chosen.algo, config_file(study), overrides=[*run_overrides(study, chosen, seed=seed), *extra])


def sampled(cfg, split: str, prompts: int, samples: int) -> dict:
    """`summarize` of `samples` samples of each of the first `prompts` prompts of `split` (train or held_out)."""
    from actors.engine import EngineSpec
    from actors.host import EngineHost
    from actors.prompts import load_tokenizer
    from launch.commands.evaluate import score_prompts, summarize
    from launch.prep.data import load_run_data

    with tempfile.TemporaryDirectory() as tmp:
        data = load_run_data(cfg, load_tokenizer(cfg.model.path, False), Path(tmp), need_demos=False)
    items = (data.train if split == "train" else data.eval)[:prompts]
    with EngineHost(EngineSpec.from_config(cfg, cfg.model.path, weight_transfer=False), name="precheck") as host:
        host.start()
        results, _ = score_prompts(host, cfg, items, samples, cfg.rollout.temperature)
    return summarize(results, samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", nargs="+", choices=sorted(CHECKS), default=sorted(CHECKS))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides after the study's own: a candidate level for a new registration "
                        "(e.g. data.arithmetic.min_digits=5)")
    args = p.parse_args(argv)
    for name in args.study:
        metric = CHECKS[name][1]
        if metric.startswith("pass@") and int(metric[5:]) > args.samples:
            p.error(f"{name} reads {metric}: --samples must be at least {metric[5:]}")
    failed, cache = False, {}
    for name in args.study:
        cfg = study_config(name, tuple(args.set))
        split, metric, passes = CHECKS[name]
        key = (cfg.model.path, cfg.data.arithmetic.model_dump_json(), split)  # studies on one level share a run
        if key not in cache:
            cache[key] = sampled(cfg, split, args.prompts, args.samples)
        figures = cache[key]
        ok = passes(figures[metric])
        failed |= not ok
        print(json.dumps({"study": name, "model": cfg.model.path, "split": split, "prompts": figures["prompts"],
                          "samples": args.samples, "set": args.set, "temperature": cfg.rollout.temperature, metric: figures[metric],
                          "figures": figures, "precondition": "PASS" if ok else "FAIL"}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
