"""The testbed's learned PRM for PURE: a 2-label token-classification model trained on step-labelled samples of
the warm policy, saved in HF format beside the warm model and read by the run through `pure.prm=hf`
(`learner.prm.pure.HFTokenClassificationPRM`) exactly as a user's PRM is.

Why learned and imperfect: PURE's central claim is that summing a learned PRM's step scores gets hacked and
its min-form does not; our rule step checker cannot be hacked (`../shared/reviews/evidence_notes.md` §1c).
A PRM trained briefly on a narrow distribution (the warm policy's own samples on steps-main) is a noisy judge
(step accuracy about 0.7, docs/running.md "The step-by-step testbed") whose mistakes a moving policy can find
and farm, as real PRMs are (PURE's, from PRM800K, scores 57.5 F1 on ProcessBench).

Recipe (`PrmRecipe`; the run's seed and data seed pick the samples):
1. sample the warm policy (`launch.prep.policy_samples.generate`, temperature 1, the rollout's) on
   `train_prompts` training prompts × `samples` and on `heldout_prompts` held-out prompts × `heldout_samples`;
2. cut each response into steps and label them as the run's PURE provider would see them: token spans by
   `learner.prm.pure.response_steps` (the provider's own function), labels from the rule step checker
   (`tasks.step_checker`): +1 → 1 (right), −1 → 0 (wrong); a step without a claim (prose, 0) or an empty one
   (None) is not trained on;
3. start from the warm policy's weights with a new 2-label head (`AutoModelForTokenClassification`, the
   class `pure.prm=hf` loads), encode each sample with the PRM's own `encode` (prompt, each step without its
   "\\n\\n", a "\\n" tag), and train cross-entropy at the tags for `steps` AdamW steps of `batch` samples;
4. load the result through `HFTokenClassificationPRM` and score the held-out samples: `prm_report.json`
   gives its step accuracy (p_k > 0 ⇔ the checker's +1), on right and on wrong steps separately.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from configs.schema import RunConfig


@dataclass(frozen=True)
class PrmRecipe:
    train_prompts: int = 256  # training prompts sampled (× samples responses)
    samples: int = 4
    heldout_prompts: int = 100  # held-out prompts the step accuracy is measured on (× heldout_samples)
    heldout_samples: int = 2
    # AdamW steps of `batch` responses: about one pass over the 1 024 training responses, short on purpose. More
    # did not make a better judge on held-out samples (docs/running.md "The step-by-step testbed"): 200 steps at
    # lr 5e-4 gave step accuracy 0.72 (0.55 on right steps), 400 steps of 32 from 2 048 responses 0.68 (train 0.78)
    steps: int = 60
    batch: int = 16
    lr: float = 2e-4


@dataclass
class Labelled:
    """One response as the PRM sees it: prompt text, response text, step character spans, one label per span
    (1 right, 0 wrong, None untrained)."""

    prompt: str
    response: str
    spans: list[tuple[int, int]]
    labels: list[int | None]


def label_responses(tokenizer, pairs) -> list[Labelled]:
    """`Labelled` of each (prompt ids, response ids) pair (module docstring, step 2)."""
    from learner.prm.pure import RuleStepChecker, response_steps

    checker, out = RuleStepChecker(), []
    for prompt_ids, response_ids in pairs:
        (prompt, response, spans), _ = response_steps(tokenizer, prompt_ids, response_ids)
        scores = checker.score_steps(prompt, response, spans)
        out.append(Labelled(prompt, response, spans, [{1.0: 1, -1.0: 0}.get(s) for s in scores]))
    return out


def init_prm(policy_dir: Path, out: Path, seed: int) -> Path:
    """Write the untrained PRM to `out`: the policy's weights and tokenizer under a new 2-label head (step 3),
    the head initialised from `seed`."""
    import torch
    from transformers import AutoModelForTokenClassification

    from actors.prompts import load_tokenizer

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForTokenClassification.from_pretrained(policy_dir, num_labels=2, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    load_tokenizer(str(policy_dir)).save_pretrained(out)
    return out


def train_prm(init_dir: Path, items: list[Labelled], recipe: PrmRecipe, seed: int, log=print) -> dict:
    """Train the PRM saved in `init_dir` (an HF token-classification directory) in place (step 3); returns
    {"loss_first", "loss_last"} (mean cross-entropy of the first and last 10 steps)."""
    import torch

    from learner.prm.pure import HFTokenClassificationPRM

    prm = HFTokenClassificationPRM(init_dir)  # its encode is the run's: same tags, same tokenizer
    model = prm.model.requires_grad_(True).train()
    encoded = []
    for it in items:
        ids, tags = prm.encode(it.prompt, it.response, it.spans)
        kept = [(t, y) for t, y in zip(tags, it.labels, strict=True) if y is not None]
        if kept:
            encoded.append((ids, kept))
    if not encoded:
        raise ValueError("no sample has a step the checker judged: nothing to train the PRM on")
    rng, order, losses = random.Random(seed), [], []
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    torch.manual_seed(seed)
    for step in range(recipe.steps):
        if len(order) < recipe.batch:
            more = list(range(len(encoded)))
            rng.shuffle(more)
            order += more
        chunk = [encoded[i] for i in order[:recipe.batch]]
        del order[:recipe.batch]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), width), prm.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for r, (row, kept) in enumerate(chunk):
            ids[r, :len(row)] = torch.tensor(row)
            mask[r, :len(row)] = 1
            for t, y in kept:
                labels[r, t] = y
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2).float(), labels.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % max(1, recipe.steps // 5) == 0 or step == recipe.steps - 1:
            log(f"[prm] step {step + 1}/{recipe.steps} cross-entropy {losses[-1]:.4f}")
    model.eval().save_pretrained(init_dir, safe_serialization=True)
    tail = min(10, len(losses))
    return {"loss_first": sum(losses[:tail]) / tail, "loss_last": sum(losses[-tail:]) / tail}


def step_accuracy(prm, items: list[Labelled]) -> dict:
    """How often the PRM's sign agrees with the checker on the labelled steps of `items` (p_k > 0 ⇔ right)."""
    scores = prm.score_batch([(it.prompt, it.response, it.spans) for it in items])
    right = wrong = right_ok = wrong_ok = 0
    for it, ps in zip(items, scores, strict=True):
        for y, p in zip(it.labels, ps, strict=True):
            if y == 1:
                right, right_ok = right + 1, right_ok + (p > 0)
            elif y == 0:
                wrong, wrong_ok = wrong + 1, wrong_ok + (p <= 0)
    n = right + wrong
    return {"steps": n, "right_steps": right, "step_accuracy": (right_ok + wrong_ok) / n if n else None,
            "accuracy_on_right_steps": right_ok / right if right else None,
            "accuracy_on_wrong_steps": wrong_ok / wrong if wrong else None}


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def prm_dir(cfg: RunConfig, warm: Path, recipe: PrmRecipe = PrmRecipe()) -> Path:
    """Where the PRM of the warm model `warm` is cached: beside it, keyed by the recipe and the seeds."""
    from launch.prep.model_prep import _key

    key = _key({"recipe": dataclasses.asdict(recipe), "seed": cfg.seed, "data_seed": cfg.data.seed,
                "max_new_tokens": cfg.rollout.max_response_tokens})
    return warm.with_name(f"{warm.name}-prm-{key}")


def sample_policy(cfg: RunConfig, warm: Path, recipe: PrmRecipe) -> tuple[list[Labelled], list[Labelled], dict]:
    """(training samples, held-out samples, their outcome accuracies) of the warm policy (steps 1-2)."""
    import torch
    from transformers import AutoModelForCausalLM

    from actors.prompts import encode_prompt, load_tokenizer
    from launch.prep.data import arithmetic_config, prompt_style
    from launch.prep.policy_samples import generate
    from tasks import make_splits, reward

    tokenizer = load_tokenizer(str(warm))
    policy = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    style = prompt_style(cfg)
    train, held = make_splits(recipe.train_prompts, recipe.heldout_prompts, seed=cfg.data.seed,
                              config=arithmetic_config(cfg))
    out, accuracy = [], {}
    for name, problems, n in (("train", train, recipe.samples), ("heldout", held, recipe.heldout_samples)):
        prompts = [encode_prompt(tokenizer, [{"role": "user", "content": p.prompt}], style)
                   for p in problems for _ in range(n)]
        responses = generate(policy, prompts, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                             max_new_tokens=cfg.rollout.max_response_tokens, sample=True,
                             seed=cfg.seed * 2 + (name == "heldout"))
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        answers = [p.answer for p in problems for _ in range(n)]
        accuracy[f"{name}_sample_accuracy"] = sum(map(reward, texts, answers)) / len(texts)
        out.append(label_responses(tokenizer, list(zip(prompts, responses))))
    return out[0], out[1], accuracy


def prepare_prm(cfg: RunConfig, warm: Path, recipe: PrmRecipe = PrmRecipe(), log=print) -> Path:
    """The cached PRM of warm model `warm`, trained if missing (module docstring); it appears by a rename,
    complete, with its `prm_report.json`. `cfg`: the warm-up's config, at the level the PRM learns from
    (`launch.prep.testbed.warm_config` gives it; the caller passes it in, so this module imports no testbed)."""
    from learner.prm.pure import HFTokenClassificationPRM

    out = prm_dir(cfg, warm, recipe)
    if (out / "config.json").is_file():
        return out
    log(f"[prm] training the testbed's PRM on {recipe.train_prompts}×{recipe.samples} samples of {warm.name}; "
        f"cached in {out}")
    start = time.monotonic()
    train, held, report = sample_policy(cfg, warm, recipe)
    sampled = time.monotonic()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    init_prm(warm, tmp, cfg.seed)
    report.update(train_prm(tmp, train, recipe, cfg.seed, log))
    prm = HFTokenClassificationPRM(tmp, batch_rows=32)  # the class and loader pure.prm=hf uses
    report.update({"heldout": step_accuracy(prm, held), "train": step_accuracy(prm, train),
                   "recipe": dataclasses.asdict(recipe), "sample_seconds": round(sampled - start, 1),
                   "train_seconds": round(time.monotonic() - sampled, 1)})
    (tmp / "prm_report.json").write_text(json.dumps(report, indent=1) + "\n")
    h = report["heldout"]
    log(f"[prm] held-out step accuracy {_share(h['step_accuracy'])} over {h['steps']} judged steps (on right "
        f"steps {_share(h['accuracy_on_right_steps'])}, on wrong steps {_share(h['accuracy_on_wrong_steps'])})")
    tmp.rename(out)
    return out
