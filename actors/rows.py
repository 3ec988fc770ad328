"""Turning vLLM completions into `buffer.records.Sample` rows: tokens, log mu, versions, finish.

Per-token weight versions -- how they are known exactly
-------------------------------------------------------
A weight update (weightsync.receiver) runs ``pause_generation(mode="keep")`` -> load ->
``finish_weight_update(weight_version=str(v))`` -> ``resume_generation()`` on the same engine that
is generating. vLLM 0.32's engine core keeps a weight-version label and attaches it to the outputs
of every engine step (`EngineCore._attach_weight_version`); the output processor turns the labels of
a request's steps into `CompletionOutput.weight_versions`, a list of `WeightVersionSpan(version,
start, end)` over output-token indices, set on the final output. This is exact, not a guess from
timing: a "keep" pause completes only once the engine has no work left (batch queue drained, output
queue flushed), the label changes only while paused, and so every token sampled by the old weights
was emitted -- and labelled -- before the label changed, and every token after the resume carries
the new one. (With `weight_sync.clear_cache` true, the default on CPU engines, the KV of kept requests is
recomputed with the new weights on resume, so tokens after the update depend on the new weights
only; false keeps the request's own old KV, and requests share cached prefixes only with requests salted with the
same weight version, `actors.generate.request_prompt`.) The actor sets the label to its initial version when the engine
starts, so no span is ever "default". After a failed or aborted push the engine is labelled with a
non-integer (`weightsync.receiver.NO_VERSION`) until the next complete push: rows holding such tokens
raise `NoVersionError` and are never trained. Counting tokens ourselves at pause time would race with
outputs still in flight between the engine core and this process; the spans do not.

Behaviour log-probs: the engine runs with ``logprobs_mode="processed_logprobs"`` and requests ask
for ``logprobs=0`` with ``flat_logprobs=True``: exactly one entry per position, the sampled token's
log-prob after temperature/top-p. Both are checked per row (a mismatch raises, never silently
misaligns).
"""

from __future__ import annotations

import numpy as np

from buffer.records import DEMO_VERSION, Sample

TRUNCATED_REASON = "length"


class RowError(RuntimeError):
    """A completion that cannot be turned into a training row (misaligned log-probs or versions)."""


class NoVersionError(RowError):
    """Tokens sampled while the engine's weights were of no version: its label was not an integer (after
    a failed or aborted push, `weightsync.receiver.NO_VERSION`, until the next complete push). The
    actor drops the group and counts it (`groups_no_version`)."""


def pinned_spans(version: int, num_tokens: int) -> list:
    """vLLM's weight-version spans of a completion sampled by one version's weights throughout (a request
    pinned to its version's LoRA adapter, `actors.adapters`): every token labelled `version`."""
    from vllm.outputs import WeightVersionSpan

    return [WeightVersionSpan(str(int(version)), 0, num_tokens)] if num_tokens else []


def versions_from_spans(spans, num_tokens: int) -> np.ndarray:
    """int32 [num_tokens] weight version of each output token from vLLM's `WeightVersionSpan`s."""
    out = np.full(num_tokens, np.iinfo(np.int32).min, dtype=np.int32)
    if num_tokens == 0:
        return out
    if not spans:
        raise RowError(f"completion of {num_tokens} tokens carries no weight-version spans "
                       "(the engine's weight version was never set?)")
    for span in spans:
        try:
            v = int(span.version)
        except ValueError as e:
            raise NoVersionError(f"tokens {span.start}..{span.end} were sampled under the weight-version label "
                                 f"{span.version!r}, not an integer version (weights of no version)") from e
        out[span.start:span.end] = v
    if (out == np.iinfo(np.int32).min).any():
        raise RowError(f"weight-version spans {spans} do not cover all {num_tokens} tokens")
    return out


def sampled_logprobs(completion) -> np.ndarray:
    """float32 [T] log mu of each sampled token of a vLLM `CompletionOutput` (flat or list logprobs)."""
    token_ids = list(completion.token_ids)
    lp = completion.logprobs
    if lp is None:
        raise RowError("completion has no logprobs: request them with SamplingParams(logprobs=0)")
    if hasattr(lp, "start_indices"):  # FlatLogprobs: parallel lists, one entry per position when logprobs=0
        if len(lp.start_indices) != len(token_ids):
            raise RowError(f"{len(lp.start_indices)} logprob positions for {len(token_ids)} tokens")
        starts = np.asarray(lp.start_indices, dtype=np.int64)
        if starts.size == 0:
            return np.zeros(0, dtype=np.float32)
        entry_tokens = np.asarray(lp.token_ids, dtype=np.int64)[starts]
        bad = np.flatnonzero(entry_tokens != np.asarray(token_ids, dtype=np.int64))
        if bad.size:
            i = int(bad[0])
            raise RowError(f"position {i}: logprob entry is for token {entry_tokens[i]}, sampled {token_ids[i]}")
        return np.asarray(lp.logprobs, dtype=np.float32)[starts]
    if len(lp) != len(token_ids):
        raise RowError(f"{len(lp)} logprob positions for {len(token_ids)} tokens")
    try:
        return np.asarray([pos[tok].logprob for pos, tok in zip(lp, token_ids)], dtype=np.float32)
    except KeyError as e:
        raise RowError(f"sampled token {e} missing from its logprob entry") from e


def sample_from_completion(completion, reward: float, prefix: list[int] | None = None) -> Sample:
    """The row of one completion. With a LUFFY `prefix` (demonstration tokens the engine was prompted
    with), the row is prefix + continuation: prefix tokens get prefix_mask True, version -1, log mu 0."""
    tokens = np.asarray(list(completion.token_ids), dtype=np.int32)
    logprobs = sampled_logprobs(completion)
    versions = versions_from_spans(completion.weight_versions, len(tokens))
    finish = str(completion.finish_reason)
    sample = Sample(tokens=tokens, logprobs=logprobs, versions=versions,
                    prefix_mask=np.zeros(len(tokens), dtype=bool), reward=float(reward),
                    finish_reason=finish, truncated=finish == TRUNCATED_REASON)
    return with_prefix(sample, prefix) if prefix else sample


def with_prefix(sample: Sample, prefix: list[int]) -> Sample:
    """`sample` with demonstration tokens `prefix` in front (off-policy: mask True, version -1, lp 0)."""
    p = len(prefix)
    return Sample(
        tokens=np.concatenate([np.asarray(prefix, dtype=np.int32), sample.tokens]),
        logprobs=np.concatenate([np.zeros(p, dtype=np.float32), sample.logprobs]),
        versions=np.concatenate([np.full(p, DEMO_VERSION, dtype=np.int32), sample.versions]),
        prefix_mask=np.concatenate([np.ones(p, dtype=bool), sample.prefix_mask]),
        reward=sample.reward, finish_reason=sample.finish_reason, truncated=sample.truncated)


def prefix_only_sample(prefix: list[int], response_length: int, reward: float) -> Sample:
    """A guided row whose demonstration prefix already fills the response budget: nothing to generate.
    The prefix is cut to `response_length` and the row counts as truncated."""
    p = prefix[:response_length]
    return Sample(tokens=np.asarray(p, dtype=np.int32), logprobs=np.zeros(len(p), dtype=np.float32),
                  versions=np.full(len(p), DEMO_VERSION, dtype=np.int32), prefix_mask=np.ones(len(p), dtype=bool),
                  reward=float(reward), finish_reason=TRUNCATED_REASON, truncated=True)
