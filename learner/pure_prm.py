"""PURE's process reward: one PRM interface, two implementations, and the "process_rewards" provider.

Interface (ALGORITHMS.md "PURE"): `score_steps(prompt, response, step_spans) -> list[float | None]`,
one p_k ∈ [−1, 1] per step, or None for a step the PRM ignores (empty, whitespace only): it gets no
step end (its tokens join the next step; an ignored last step joins the one before, whose end moves to
the final token, which always ends a step); `step_spans` are (start, end) character spans into `response`.
  - `RuleStepChecker`: the synthetic task's exact step checker (`tasks.step_checker`), so PURE is
    meaningful on a laptop.
  - `HFTokenClassificationPRM`: an `AutoModelForTokenClassification` with 2 labels scored PURE-style
    (REFERENCE_NOTES §3.1–3.2): input = prompt, then every step without its end separator followed by
    one "\\n" token; p_k = softmax[1] − softmax[0] of the logits at step k's "\\n".
    Deviation from the reference, which works on the policy's token ids: this interface is text, so
    the PRM tokenizes the prompt and each step itself (any PRM tokenizer works), and a step's removed
    end is the "\\n\\n" separator text rather than the step's last token (the final eos is not text,
    so the final step loses nothing; a response cut off mid-step keeps its last character).
The provider decodes every response token by token, splits steps with `algos.pure_steps.step_spans`
(a step ends where its text first ends with "\\n\\n", plus the final token), scores them, and writes
extras["step_end_mask"] [B, T] bool and extras["step_scores"] [B, T] (p_k at step ends, 0 elsewhere).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from algos.pure_steps import SEPARATOR, scores_from_logits, step_spans
from learner.providers import Provider, ProviderContext, register_provider

if TYPE_CHECKING:
    from learner.learner import Learner


class ProcessRewardModel(Protocol):
    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float | None]:
        ...


class RuleStepChecker:
    """The rule-based checker of `tasks.step_checker` (prompts must hold 'What is <a><op><b>?')."""

    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float | None]:
        from tasks.step_checker import score_steps

        return score_steps(prompt, response, step_spans)


class HFTokenClassificationPRM:
    """A 2-label token-classification PRM read at a "\\n" tag appended after each step (see module doc)."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 step_tag: str = "\n", separator: str = SEPARATOR):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForTokenClassification.from_pretrained(path, dtype=dtype).to(device).eval()
        if self.model.config.num_labels != 2:
            raise ValueError(f"{path}: a PURE PRM needs 2 labels, the model has {self.model.config.num_labels}")
        tag = self.tokenizer(step_tag, add_special_tokens=False)["input_ids"]
        if len(tag) != 1:
            raise ValueError(f"{path}: the step tag {step_tag!r} must be one token for this tokenizer, got {tag}")
        self.tag_id = tag[0]
        self.separator = separator
        self.device = torch.device(device)

    def encode(self, prompt: str, response: str, spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
        """(input ids, positions of the step tags)."""
        ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        tags = []
        for a, b in spans:
            if not 0 <= a <= b <= len(response):
                raise ValueError(f"step span {(a, b)} outside the response (length {len(response)})")
            text = response[a:b]
            if text.endswith(self.separator):
                text = text[:-len(self.separator)]
            ids += self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
            ids.append(self.tag_id)
            tags.append(len(ids) - 1)
        return ids, tags

    @torch.no_grad()
    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float]:
        if not step_spans:
            return []
        ids, tags = self.encode(prompt, response, step_spans)
        logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0]
        return scores_from_logits(logits[torch.tensor(tags, device=self.device)]).tolist()


def make_prm(cfg, device: torch.device) -> ProcessRewardModel:
    """The PRM named by cfg.pure.prm ("rule" or "hf" with cfg.pure.prm_path)."""
    pc = cfg.pure
    if pc.prm == "rule":
        return RuleStepChecker()
    if pc.prm == "hf":
        if not pc.prm_path:
            raise ValueError("pure.prm=hf needs pure.prm_path (a token-classification PRM directory)")
        return HFTokenClassificationPRM(pc.prm_path, device=device)
    raise ValueError(f"unknown pure.prm {pc.prm!r}; choose 'rule' or 'hf'")


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Decoded text of each token (special tokens → ""), such that "".join(...) is the decoded response.

    Per-token decoding is exact for character and most BPE vocabularies; when a token decodes to a
    partial UTF-8 character ("\\ufffd"), the row falls back to prefix-difference decoding.
    """
    ids = [int(i) for i in ids]
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True,
                                   clean_up_tokenization_spaces=False)
    if not any("\ufffd" in t for t in texts):
        return texts
    out, prev = [], ""
    for k in range(len(ids)):
        cur = tokenizer.decode(ids[:k + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        out.append(cur[len(prev):] if cur.startswith(prev) else cur)
        prev = cur
    return out


def score_response(prm: ProcessRewardModel, tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int],
                   ) -> tuple[list[int], list[float]]:
    """(step-end token positions, step scores) of one response."""
    texts = token_texts(tokenizer, response_ids)
    spans = step_spans(texts)
    offsets = [0]
    for t in texts:
        offsets.append(offsets[-1] + len(t))
    char_spans = [(offsets[a], offsets[b]) for a, b in spans]
    prompt = tokenizer.decode([int(i) for i in prompt_ids], skip_special_tokens=False,
                              clean_up_tokenization_spaces=False)
    raw = prm.score_steps(prompt, "".join(texts), char_spans)
    if len(raw) != len(spans):
        raise ValueError(f"the PRM returned {len(raw)} scores for {len(spans)} steps")
    kept = [(b - 1, float(s)) for (_, b), s in zip(spans, raw) if s is not None]
    bad = [s for _, s in kept if not (math.isfinite(s) and -1.0 <= s <= 1.0)]
    if bad:
        raise ValueError(f"PRM step scores must be finite and in [-1, 1], got {bad[:3]}")
    if not spans:
        return [], []
    final = spans[-1][1] - 1
    if not kept:  # nothing but whitespace: one step without a claim
        return [final], [0.0]
    # The final token always ends a step (algos.pure.check_step_ends): an ignored (empty) last step
    # folds into the step before it, whose end moves to the final token.
    kept[-1] = (final, kept[-1][1])
    return [p for p, _ in kept], [s for _, s in kept]


@register_provider("process_rewards")
class ProcessRewards(Provider):
    def __init__(self, learner: Learner):
        self.tokenizer = learner.tokenizer
        self.prm = make_prm(learner.cfg, learner.device)
        self._metrics: dict[str, float] = {}

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        n, dev = len(ctx.local), ctx.response_mask.device
        ends = torch.zeros(n, ctx.width, dtype=torch.bool)
        scores = torch.zeros(n, ctx.width, dtype=torch.float32)
        for i, g in enumerate(ctx.local):
            row = ctx.rows[g]
            pos, vals = score_response(self.prm, self.tokenizer, row.prompt, row.response)
            if pos:
                ends[i, pos] = True
                scores[i, pos] = torch.tensor(vals)
        return {"step_end_mask": ends.to(dev), "step_scores": scores.to(dev)}
