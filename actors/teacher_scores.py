"""A teacher's log-probs of the student's tokens on a vLLM engine (`teacher.scoring: engine`): the request, the
temperature, and which of vLLM's prompt log-probs are the response's.

What is scored, exactly as `learner.providers.TeacherLogprobs` scores it on the learner ranks: the row's prompt and
response token ids as they are, one request each (`score_request`), whose prompt log-probs (`prompt_logprobs=0`:
the log-prob of each given token after the ones before it, nothing sampled that matters: `max_tokens=1`) at the
response's positions are log-softmax(logits / T)[y_t] with T = rollout.temperature and no top-k/top-p. Response
token t is prompt position P + t of the request, so its log-prob is entry P + t of vLLM's list (entry 0, the first
prompt token, has none) (`response_logprobs`). Environment tokens of a multi-turn row are scored like any token;
the learner's response_mask zeroes them, as it zeroes the learner-side teacher's.

The temperature: vLLM's prompt log-probs skip the sampler (no temperature, whatever `logprobs_mode`; vLLM 0.32
`gpu_model_runner._get_prompt_logprobs_dict` log-softmaxes the model's logits as they are). So a scoring engine
is started with `TemperedLogits` as its worker extension, and `temper_logits(T)` multiplies the scale of the
model's own logits layer (`LogitsProcessor.scale`, applied to every logit before any log-softmax) by 1/T: the
prompt log-probs are then the tempered ones, exactly. Such an engine must never sample for the run (its sampler
would temper twice); it only scores. A model class without that layer is refused when the engine starts.
A request with prompt log-probs never reads vLLM's prefix cache (vLLM's own rule: `SamplingParams.
skip_reading_prefix_cache`), so every position is computed under the teacher's weights.
"""

from __future__ import annotations

import numpy as np

TEMPERED_LOGITS = "actors.teacher_scores.TemperedLogits"  # AsyncEngineArgs(worker_extension_cls=...)


class TemperedLogits:
    """vLLM worker extension: `engine.collective_rpc("temper_logits", args=(T,))` divides every logit by T."""

    def temper_logits(self, temperature: float) -> float:
        layer = getattr(self.get_model(), "logits_processor", None)
        if layer is None or not hasattr(layer, "scale"):
            raise RuntimeError(f"{type(self.get_model()).__name__} has no logits_processor.scale: its teacher "
                               "log-probs cannot be tempered on the engine — set rollout.temperature=1 or "
                               "teacher.scoring=learner")
        layer.scale = float(layer.scale) / temperature
        return layer.scale


def score_request(prompt, response) -> tuple[list[int], object]:
    """The token ids and sampling parameters of one row's scoring request."""
    from vllm import SamplingParams

    ids = [int(t) for t in prompt] + [int(t) for t in response]
    return ids, SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)


def response_logprobs(prompt_logprobs, ids: list[int], prompt_len: int) -> np.ndarray:
    """float32 [len(ids) − prompt_len]: the log-prob of each response token, from vLLM's prompt log-probs of
    `ids` (entry k: {token id: Logprob} for position k, None at k = 0)."""
    if prompt_logprobs is None or len(prompt_logprobs) != len(ids):
        got = None if prompt_logprobs is None else len(prompt_logprobs)
        raise RuntimeError(f"the teacher's engine returned {got} prompt log-probs for {len(ids)} tokens")
    out = np.empty(len(ids) - prompt_len, dtype=np.float32)
    for t, k in enumerate(range(prompt_len, len(ids))):
        entry = prompt_logprobs[k]
        if entry is None or ids[k] not in entry:
            raise RuntimeError(f"the teacher's engine gave no log-prob for token {ids[k]} at position {k}")
        out[t] = entry[ids[k]].logprob
    return out


async def score_row(engine, prompt, response, request_id: str) -> np.ndarray:
    """float32 [len(response)]: log π_teacher of each response token of one row (module docstring)."""
    ids, params = score_request(prompt, response)
    final = None
    async for out in engine.generate({"prompt_token_ids": ids}, params, request_id=request_id):
        final = out
    return response_logprobs(final.prompt_logprobs if final is not None else None, ids, len(prompt))
