"""What the model generates: a few trained samples every `logging.samples_every` steps, at step 1, and
at every step whose generated samples all scored 0 (what to read when a run learns nothing: a reward
that never fires, a format the model never hits), decoded, in `samples.jsonl` (one JSON object per
sample) and as TensorBoard text. `logging.samples_every: 0` writes none.

Which samples: `logging.samples_per_step` groups spread evenly over the step's batch (positions
⌊k·G/m⌋ for k = 0..m−1 of G groups), and within the k-th of them the generated sample with the highest
reward for even k, the lowest for odd k — so a step with both shows a success and a failure.
Demonstration-only rows (SFT, LUFFY ρ = 1) are not samples of the model and are never chosen.

A record: step (the learner step that trained it), version (weight version of the sample's oldest
generated token), prompt_index, data_source, prompt (decoded without special tokens), response (as the
reward function read it: decoded without special tokens; a LUFFY prefix included, its length in
guided_prefix_tokens), ground_truth, reward, finish_reason ("length" = cut at rollout.max_response_tokens)
and response_tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buffer.records import Group, Sample


def pick(groups: list[Group], m: int) -> list[tuple[Group, Sample]]:
    """The (group, sample) pairs to show (module docstring); fewer when fewer groups have generated rows."""
    live = [g for g in groups if any(s.finish_reason != "demo" for s in g.samples)]
    chosen = []
    for k in range(min(m, len(live))):
        g = live[k * len(live) // min(m, len(live))]
        gen = [s for s in g.samples if s.finish_reason != "demo"]
        chosen.append((g, max(gen, key=lambda s: s.reward) if k % 2 == 0 else min(gen, key=lambda s: s.reward)))
    return chosen


def all_zero(groups: list[Group]) -> bool:
    """Whether the step's generated samples (demonstrations aside) all scored 0; False when it has none."""
    rewards = [s.reward for g in groups for s in g.samples if s.finish_reason != "demo"]
    return bool(rewards) and not any(rewards)


def record(step: int, group: Group, sample: Sample, decode) -> dict[str, Any]:
    """The JSON record of one sample (module docstring); decode(ids) -> text without special tokens."""
    on_policy = sample.on_policy_versions
    return {"step": step, "version": int(on_policy.min()) if on_policy.size else None,
            "prompt_index": int(group.prompt_index), "data_source": group.data_source,
            "prompt": decode(group.prompt_tokens.tolist()), "response": decode(sample.tokens.tolist()),
            "ground_truth": group.ground_truth, "reward": float(sample.reward), "finish_reason": sample.finish_reason,
            "response_tokens": int(sample.tokens.size), "guided_prefix_tokens": int(sample.prefix_mask.sum())}


def markdown(records: list[dict[str, Any]]) -> str:
    """TensorBoard text of a step's samples."""
    parts = []
    for r in records:
        parts.append(f"**reward {r['reward']:g}** (version {r['version']}, {r['finish_reason']}, "
                     f"{r['response_tokens']} tokens; expected `{r['ground_truth']}`)\n\n"
                     f"prompt:\n\n    {r['prompt'].replace(chr(10), chr(10) + '    ')}\n\n"
                     f"response:\n\n    {r['response'].replace(chr(10), chr(10) + '    ')}")
    return "\n\n---\n\n".join(parts)


def _step_of(line: str) -> float:
    """Step of a samples.jsonl line; a broken line (a crash mid-write) sorts after every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class SampleLog:
    """Writes the samples of every `every`-th step (0 = never) to run_dir/samples.jsonl and, through
    `text_sink(tag, text, step)` (`MetricsWriter.write_text`), to TensorBoard. The tokenizer is loaded
    from `model_dir` the first time a step is written."""

    def __init__(self, run_dir: Path, every: int, per_step: int, model_dir: str | Path, text_sink=None,
                 from_step: int = 0, trust_remote_code: bool = False):
        """from_step: the step a resumed run continues from; records of later steps are dropped (those
        steps are trained again), as `MetricsWriter` does with metrics.jsonl. trust_remote_code:
        model.trust_remote_code, for the tokenizer."""
        self.path = Path(run_dir) / "samples.jsonl"
        self.every, self.per_step, self.model_dir, self.text_sink = every, per_step, str(model_dir), text_sink
        self._tokenizer, self.trust_remote_code = None, trust_remote_code
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            self.path.write_text("".join(f"{line}\n" for line in lines if _step_of(line) <= from_step))

    def _decode(self, ids: list[int]) -> str:
        if self._tokenizer is None:
            from actors.prompts import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_dir, self.trust_remote_code)
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def write(self, step: int, groups: list[Group]) -> list[dict[str, Any]]:
        """The records written for `step` ([] when it is not a sampled step: module docstring)."""
        if not self.every or (step % self.every and step != 1 and not all_zero(groups)):
            return []
        records = [record(step, g, s, self._decode) for g, s in pick(groups, self.per_step)]
        if records:
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            if self.text_sink is not None:
                self.text_sink("samples", markdown(records), step)
        return records
