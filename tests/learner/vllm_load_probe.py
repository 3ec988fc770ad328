"""Load a checkpoint directory with vLLM (CPU) and print the prompt's log-probs and a greedy continuation.

Run in a child process by test_checkpoint.py (the engine runs in this process:
VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni", saving a process start on a busy 2-core machine).

    python tests/learner/vllm_load_probe.py CHECKPOINT_DIR PROMPT
"""

import json
import os
import sys


def main(model_dir: str, prompt: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              distributed_executor_backend="uni")
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=0))[0]
    result = {
        "prompt_token_ids": list(out.prompt_token_ids),
        "prompt_logprobs": [None if d is None else d[t].logprob for d, t in zip(out.prompt_logprobs,
                                                                                out.prompt_token_ids)],
        "generated": list(out.outputs[0].token_ids),
    }
    print("PROBE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
