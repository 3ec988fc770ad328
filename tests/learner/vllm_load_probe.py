"""Load a checkpoint directory with vLLM (CPU) and print the prompt's log-probs and a greedy continuation.

Run in a child process by test_checkpoint.py (the engine runs in this process:
VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni", saving a process start on a busy 2-core machine).

    python tests/learner/vllm_load_probe.py CHECKPOINT_DIR PROMPT [ADAPTER_DIR]

With ADAPTER_DIR (a peft adapter of CHECKPOINT_DIR's model, a LoRA run's hf/step_<N>), the engine starts with
LoRA enabled and serves the prompt through that adapter.
"""

import json
import os
import sys


def main(model_dir: str, prompt: str, adapter: str | None = None) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    lora = {}
    if adapter is not None:
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            rank = json.load(f)["r"]
        lora = {"enable_lora": True, "max_loras": 1, "max_lora_rank": next(r for r in (8, 16, 32, 64) if r >= rank)}
    llm = LLM(model=model_dir, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              distributed_executor_backend="uni", **lora)
    request = LoRARequest("adapter", 1, adapter) if adapter is not None else None
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=0),
                       lora_request=request)[0]
    result = {
        "prompt_token_ids": list(out.prompt_token_ids),
        "prompt_logprobs": [None if d is None else d[t].logprob for d, t in zip(out.prompt_logprobs,
                                                                                out.prompt_token_ids)],
        "generated": list(out.outputs[0].token_ids),
    }
    print("PROBE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
