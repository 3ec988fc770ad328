"""PURE's process reward: one PRM interface, two implementations, and the "process_rewards" provider.

Interface (ALGORITHMS.md "PURE"): `score_steps(prompt, response, step_spans) -> list[float | None]`,
one p_k ∈ [−1, 1] per step, or None for a step the PRM ignores (empty, whitespace only): it gets no
step end (its tokens join the next step; an ignored last step joins the one before, whose end moves to
the final token, which always ends a step); `step_spans` are (start, end) character spans into `response`.
  - `RuleStepChecker`: the synthetic task's exact step checker (`tasks.step_checker`), so PURE is
    meaningful on a laptop.
  - `HFTokenClassificationPRM`: an `AutoModelForTokenClassification` with 2 labels scored PURE-style
    (REFERENCE_NOTES §3.1–3.2): input = prompt, then every step without its end separator followed by
    one "\\n" token; p_k = softmax[1] − softmax[0] of the logits at step k's "\\n". It scores many
    responses per forward (`score_batch`: length-sorted, right-padded, at most `batch_rows` rows and
    `batch_tokens` tokens counted as rows × the longest row, the rule of the policy's padded
    micro-batches and its budget, `learner.micro_batch_tokens`: a forward of 32 rows of 4 k tokens
    would hold ~15 GB of a 7B PRM's MLP transients) in the run's compute dtype (`model.dtype`: bf16 on
    a GPU).
    Deviation from the reference, which works on the policy's token ids: this interface is text, so
    the PRM tokenizes the prompt and each step itself (any PRM tokenizer works), and a step's removed
    end is the "\\n\\n" separator text rather than the step's last token (the final eos is not text,
    so the final step loses nothing; a response cut off mid-step keeps its last character).
The provider decodes every response token by token, splits steps with `algos.pure.steps.step_spans`
(a step ends where its text first ends with "\\n\\n", plus the final token; in a multi-turn run, `env:`, with
`algos.pure.steps.turn_spans` instead: one step per policy turn, holding the observation before it), scores them,
and writes extras["step_end_mask"] [B, T] bool and extras["step_scores"] [B, T] (p_k at step ends, 0 elsewhere),
and with `pure.vr_fraction` < 1 extras["vr_rows"] [B] bool (`algos.pure.maths.vr_prompt` of the prompt's ids).
Each rank scores only its own rows (`ProviderContext.local`, once per learner step, all of them in
one `score_responses` call); the learner all-gathers the outputs. The PRM is sharded over the ranks
with FSDP2 like the reference model when the learner shards (world > 1; `learner.fsdp.shard_frozen`: a
7B PRM takes 1/8 of its 15.2 GB per rank on 8 ranks, plus its embedding while it runs, instead of a whole
copy): its forwards are then collectives, so every rank runs as many as the busiest one (a rank with
fewer rows adds one-token forwards). It is built on the meta device and each rank reads its own rows of
each tensor from the safetensors files straight into device memory (`load_prm`), so a rank's host RAM
holds at most one tensor of it (a 7B PRM's embedding, ~1 GB in bf16); only a directory without
safetensors weights falls back to `from_pretrained` (whole on the host, then moved and sharded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from algos.pure.maths import vr_prompt
from algos.pure.steps import SEPARATOR, scores_from_logits, step_spans, turn_spans
from learner.prm.agreement import prm_agreement
from learner.provider_base import ModelHost, Provider, ProviderContext


class ProcessRewardModel(Protocol):
    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float | None]:
        ...


class RuleStepChecker:
    """The rule-based checker of `tasks.step_checker` (prompts must hold 'What is <a><op><b>?')."""

    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float | None]:
        from tasks.step_checker import score_steps

        return score_steps(prompt, response, step_spans)


def load_prm(path: str | Path, device: torch.device, dtype: torch.dtype, auto_class,
             trust_remote_code: bool = False, mesh=None) -> torch.nn.Module:
    """The PRM of `path` on `device` in `dtype` without a whole copy in host RAM (module doc): built on the
    meta device from its config, sharded over `mesh` (None: whole), materialised on `device`, filled tensor
    by tensor from the safetensors files (`learner.fsdp.load_local_weights`: each rank its own rows). A
    directory without safetensors weights, or whose tensor names do not match the model's, is loaded
    whole by `from_pretrained`, moved and sharded."""
    from transformers import AutoConfig

    from learner.fsdp import disable_dropout, init_buffers, load_local_weights, shard_frozen

    try:
        with torch.device("meta"):
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
            model = auto_class.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
        if mesh is not None:
            shard_frozen(model, mesh)
        model.to_empty(device=device)
        init_buffers(model)
        load_local_weights(model, path)
    except (FileNotFoundError, KeyError, ValueError):
        model = auto_class.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code).to(device)
        if mesh is not None:
            shard_frozen(model, mesh)
    disable_dropout(model)
    model.requires_grad_(False)
    return model


def token_batches(lengths: Sequence[int], max_rows: int, max_tokens: int | None) -> list[list[int]]:
    """Positions of ascending `lengths` in consecutive batches of at most `max_rows` rows and, padded to
    their longest row, at most `max_tokens` tokens (rows × longest; None: no cap); a row over the budget
    on its own forms a batch alone."""
    batches: list[list[int]] = []
    for k, n in enumerate(lengths):
        last = batches[-1] if batches else None
        if last is not None and len(last) < max_rows and (max_tokens is None or (len(last) + 1) * n <= max_tokens):
            last.append(k)
        else:
            batches.append([k])
    return batches


class HFTokenClassificationPRM:
    """A 2-label token-classification PRM read at a "\\n" tag appended after each step (see module doc)."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 step_tag: str = "\n", separator: str = SEPARATOR, batch_rows: int = 16,
                 batch_tokens: int | None = None, mesh=None, trust_remote_code: bool = False):
        """batch_rows, batch_tokens: the limits of one forward (`token_batches`); mesh: the learner's device
        mesh to shard the PRM over (FSDP2; every rank of it must call `score_batch` together), None: whole."""
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.model = load_prm(path, torch.device(device), dtype, AutoModelForTokenClassification,
                              trust_remote_code, mesh).eval()
        self.sharded = mesh is not None
        if self.model.config.num_labels != 2:
            raise ValueError(f"{path}: a PURE PRM needs 2 labels, the model has {self.model.config.num_labels}")
        tag = self.tokenizer(step_tag, add_special_tokens=False)["input_ids"]
        if len(tag) != 1:
            raise ValueError(f"{path}: the step tag {step_tag!r} must be one token for this tokenizer, got {tag}")
        self.tag_id = tag[0]
        self.separator = separator
        self.device = torch.device(device)
        self.batch_rows, self.batch_tokens = int(batch_rows), batch_tokens
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

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

    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float]:
        return self.score_batch([(prompt, response, step_spans)])[0]

    @torch.no_grad()
    def score_batch(self, items: Sequence[tuple[str, str, Sequence[tuple[int, int]]]]) -> list[list[float]]:
        """`score_steps` of many (prompt, response, step spans) items, in forwards of at most `batch_rows`
        rows and `batch_tokens` tokens (`token_batches`).

        Rows are sorted by length (less padding) and right-padded with an attention mask: a real
        token never attends to padding, so a row's scores are those of its forward alone up to the
        rounding of another kernel shape (tests/learner/test_pure_prm.py bounds it). Sharded, every
        rank runs as many forwards as the rank with the most (one-token forwards for the rest), since
        each one gathers the parameters from all ranks; then the root unit is resharded.
        """
        encoded = [self.encode(*item) if item[2] else ([], []) for item in items]
        out: list[list[float]] = [[] for _ in items]
        order = sorted((i for i, (_, tags) in enumerate(encoded) if tags), key=lambda i: len(encoded[i][0]))
        batches: list[list[int] | None] = [
            [order[k] for k in b]
            for b in token_batches([len(encoded[i][0]) for i in order], self.batch_rows, self.batch_tokens)]
        if self.sharded:
            from learner.distributed import all_reduce_extremes

            batches += [None] * (all_reduce_extremes(len(batches))[1] - len(batches))
        for chunk in batches:
            if chunk is None:  # this rank's share of another rank's forward
                self.model(input_ids=torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device))
                continue
            width = max(len(encoded[i][0]) for i in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, i in enumerate(chunk):
                n = len(encoded[i][0])
                ids[r, :n] = torch.tensor(encoded[i][0])
                mask[r, :n] = 1
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            for r, i in enumerate(chunk):
                out[i] = scores_from_logits(logits[r, encoded[i][1]]).tolist()
        if self.sharded:
            from learner.fsdp import ensure_sharded

            ensure_sharded(self.model)
        return out


def make_prm(cfg, device: torch.device, dtype: torch.dtype = torch.float32, mesh=None) -> ProcessRewardModel:
    """The PRM named by cfg.pure.prm: "rule", "hf" with cfg.pure.prm_path (loaded in `dtype` on `device`,
    sharded over `mesh` when given, scoring at most `learner.micro_batch_samples` rows and
    `learner.micro_batch_tokens` (resolved for `device`) tokens per forward; the config guarantees the
    path, `algos.pure.options.pure_problems`), or a step-scoring function."""
    pc = cfg.pure
    if pc.prm == "rule":
        return RuleStepChecker()
    if pc.prm == "hf":
        lc = cfg.learner
        return HFTokenClassificationPRM(pc.prm_path, device=device, dtype=dtype, batch_rows=lc.micro_batch_samples,
                                        batch_tokens=lc.resolved_micro_batch_tokens(device.type == "cuda"),
                                        mesh=mesh, trust_remote_code=cfg.model.trust_remote_code)
    return FunctionStepScorer(pc.prm)


class FunctionStepScorer:
    """A user's step scorer, `pure.prm: module:function` or `path/to/file.py:function`, called as
    `fn(prompt, response, step_spans) -> list[float | None]` (one score per step, None = unscored; spans
    are character (start, end) offsets into `response`). It runs in the learner process: a scorer
    is a model-like component, trusted like the PRM directory it replaces (rewards, which run on
    every sample, get worker isolation instead: `tasks.rewards`)."""

    def __init__(self, name: str):
        from tasks.worker import load_function

        self.name, self.fn = name, load_function(name)

    def score_steps(self, prompt: str, response: str, step_spans: Sequence[tuple[int, int]]) -> list[float | None]:
        scores = list(self.fn(prompt, response, list(step_spans)))
        if len(scores) != len(step_spans):
            raise ValueError(f"pure.prm={self.name} returned {len(scores)} scores for {len(step_spans)} steps")
        return [None if v is None else float(v) for v in scores]


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Decoded text of each token (special tokens → ""), such that "".join(...) is the decoded response.

    Per-token decoding is exact for character and most BPE vocabularies. When a token decodes to a
    partial UTF-8 character ("\ufffd": a multi-byte character split across byte-level tokens), the row is
    decoded incrementally instead, as vLLM's detokenizer does (`detokenize_incrementally`): each token's
    text is what a small window — the tokens since the last emitted text's start, at most a few — adds,
    and a token that leaves a character unfinished gets "" (the character goes to the token completing
    it). O(n) decoding of short windows; an unfinished character at the end goes to the last token.
    """
    ids = [int(i) for i in ids]
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True,
                                   clean_up_tokenization_spaces=False)
    if not any("\ufffd" in t for t in texts):
        return texts

    def decode(a: int, b: int) -> str:
        return tokenizer.decode(ids[a:b], skip_special_tokens=True, clean_up_tokenization_spaces=False)

    out: list[str] = []
    prefix = read = 0  # ids[prefix:read]: the last emitted text's tokens (look-back context); read: emitted up to
    for k in range(len(ids)):
        before, now = decode(prefix, read), decode(prefix, k + 1)
        if len(now) > len(before) and not now.endswith("\ufffd"):
            out.append(now[len(before):])
            prefix, read = read, k + 1
        else:
            out.append("")
    if out and read < len(ids):  # the response ends inside a character
        out[-1] += decode(prefix, len(ids))[len(decode(prefix, read)):]
    return out


def response_steps(tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int], env=None,
                   ) -> tuple[tuple[str, str, list[tuple[int, int]]], list[tuple[int, int]]]:
    """((prompt text, response text, step character spans), step token spans) of one response; `env` (bool per
    response token, multi-turn runs): one step per policy turn (`algos.pure.steps.turn_spans`) instead of
    "\\n\\n"-separated steps."""
    texts = token_texts(tokenizer, response_ids)
    spans = step_spans(texts) if env is None else turn_spans([bool(e) for e in env])
    offsets = [0]
    for t in texts:
        offsets.append(offsets[-1] + len(t))
    prompt = tokenizer.decode([int(i) for i in prompt_ids], skip_special_tokens=False,
                              clean_up_tokenization_spaces=False)
    return (prompt, "".join(texts), [(offsets[a], offsets[b]) for a, b in spans]), spans


def step_ends(spans: Sequence[tuple[int, int]], raw: Sequence[float | None]) -> tuple[list[int], list[float]]:
    """(step-end token positions, step scores) from the token spans of the steps and the PRM's raw scores."""
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
    # The final token always ends a step (algos.pure.maths.check_step_ends): an ignored (empty) last step
    # folds into the step before it, whose end moves to the final token.
    kept[-1] = (final, kept[-1][1])
    return [p for p, _ in kept], [s for _, s in kept]


def score_responses(prm: ProcessRewardModel, tokenizer, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                    ) -> list[tuple[list[int], list[float]]]:
    """(step-end token positions, step scores) of each (prompt ids, response ids) pair; a PRM with a
    `score_batch` method scores them all in one call, any other one response at a time."""
    steps = [response_steps(tokenizer, p, r) for p, r in pairs]
    raw = raw_scores(prm, [item for item, _ in steps])
    return [step_ends(spans, r) for (_, spans), r in zip(steps, raw)]


def raw_scores(prm: ProcessRewardModel, items) -> list[list[float | None]]:
    """The PRM's scores of (prompt, response, step spans) items: in one call when it has `score_batch`."""
    batch = getattr(prm, "score_batch", None)
    return batch(items) if batch is not None else [prm.score_steps(*item) for item in items]


def score_response(prm: ProcessRewardModel, tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int],
                   ) -> tuple[list[int], list[float]]:
    """(step-end token positions, step scores) of one response."""
    return score_responses(prm, tokenizer, [(prompt_ids, response_ids)])[0]


class ProcessRewards(Provider):
    """The "process_rewards" provider (module docstring)."""

    def __init__(self, host: ModelHost):
        self.tokenizer = host.tokenizer
        # sharded over the ranks like the reference when the learner shards (a Learner's `fsdp`, `mesh`)
        mesh = host.mesh if getattr(host, "fsdp", False) else None
        self.prm = make_prm(host.cfg, host.device, host.compute_dtype, mesh)
        self.vr_fraction, self.seed = host.cfg.pure.vr_fraction, host.cfg.seed
        self.turns = host.cfg.env.enabled  # multi-turn rows: a policy turn is a step
        self._metrics: dict[str, float] = {}

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        n, dev = len(ctx.local), ctx.response_mask.device
        ends = torch.zeros(n, ctx.width, dtype=torch.bool)
        scores = torch.zeros(n, ctx.width, dtype=torch.float32)
        rows = [ctx.rows[g] for g in ctx.local]
        steps = [response_steps(self.tokenizer, r.prompt, r.response, r.env if self.turns else None) for r in rows]
        items = [item for item, _ in steps]
        raw = raw_scores(self.prm, items)
        for i, ((_, spans), r) in enumerate(zip(steps, raw)):
            pos, vals = step_ends(spans, r)
            if pos:
                ends[i, pos] = True
                scores[i, pos] = torch.tensor(vals)
        self._metrics = prm_agreement(items, raw, [r.reward for r in rows], [r.group for r in rows],
                                      against_checker=not isinstance(self.prm, RuleStepChecker))
        out = {"step_end_mask": ends.to(dev), "step_scores": scores.to(dev)}
        if self.vr_fraction < 1.0:  # [b_local] 1 = the prompt gets the verifiable reward (pure.vr_fraction)
            out["vr_rows"] = torch.tensor([vr_prompt(r.prompt, self.seed, self.vr_fraction) for r in rows],
                                          dtype=torch.bool, device=dev)
        return out

    def metrics(self) -> dict[str, float]:
        """This step's `learner.prm.agreement` metrics."""
        return self._metrics
