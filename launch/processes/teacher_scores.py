"""A teacher's log-probs of the student's tokens on a vLLM engine (`teacher.scoring: engine`): the request, the
temperature, and which of vLLM's prompt log-probs are the response's.

What is scored, exactly as `learner.providers.TeacherLogprobs` scores it on the learner ranks: the row's prompt and
response token ids as they are, log-softmax(logits / T)[y_t] of each response token y_t after the ones before it,
T = rollout.temperature, no top-k/top-p. One request per row (`score_request`): its prompt is the row's prompt and
response but the last token, P + T − 1 ids, and it generates one token. Response token t < T − 1 is then prompt
position P + t, whose log-prob is vLLM's prompt log-prob entry P + t (`prompt_logprobs=0`: each given token's own;
entry 0, the first prompt token, has none); the last response token is the one the request would generate, whose
log-prob vLLM returns for a named token (`logprob_token_ids`), whatever it samples: the sampler's log-softmax at
temperature 1 with no top-k/top-p, of the same logits (`response_logprobs`). So a row as long as the whole context (max_model_len) is scored within it. Environment tokens
of a multi-turn row are scored like any token; the learner's response_mask zeroes them, as it zeroes the
learner-side teacher's.

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

TEMPERED_LOGITS = "launch.processes.teacher_scores.TemperedLogits"  # AsyncEngineArgs(worker_extension_cls=...)


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


def score_request(prompt, response) -> tuple[list[int], int]:
    """One row's scoring request (a response of at least one token): its prompt ids, the row but its last token,
    and that last token, whose log-prob is asked for at the generated position (`actors.engine.scored_answer`)."""
    return [int(t) for t in prompt] + [int(t) for t in response[:-1]], int(response[-1])


def response_logprobs(prompt_logprobs, last, prompt, response) -> np.ndarray:
    """float32 [len(response)]: the log-prob of each response token, from vLLM's answer to `score_request`:
    `prompt_logprobs` (entry k: {token id: Logprob} for prompt position k, None at k = 0) and `last`, the
    generated position's {token id: Logprob} holding the last response token's."""
    ids = [int(t) for t in prompt] + [int(t) for t in response]
    p, n = len(prompt), len(ids) - 1  # n: the request's prompt length
    if prompt_logprobs is None or len(prompt_logprobs) != n:
        got = None if prompt_logprobs is None else len(prompt_logprobs)
        raise RuntimeError(f"the teacher's engine returned {got} prompt log-probs for {n} tokens")
    entries = [*prompt_logprobs[p:], last]
    out = np.empty(len(response), dtype=np.float32)
    for t, (k, entry) in enumerate(zip(range(p, len(ids)), entries)):
        if entry is None or ids[k] not in entry:
            raise RuntimeError(f"the teacher's engine gave no log-prob for token {ids[k]} at position {k}")
        out[t] = entry[ids[k]].logprob
    return out


async def score_row(engine, prompt, response, request_id: str) -> np.ndarray:
    """float32 [len(response)]: log π_teacher of each response token of one row (module docstring)."""
    from actors.engine import scored_answer

    if len(response) == 0:
        return np.zeros(0, dtype=np.float32)
    ids, last = score_request(prompt, response)
    return response_logprobs(*await scored_answer(engine, ids, last, request_id), prompt, response)
