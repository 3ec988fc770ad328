"""A 1 MB prompt in a data file is tokenised once at start (seconds, no crash), skipped for being longer
than data.max_prompt_tokens, and counted in the start-up line; the other prompts train."""

import json
import time

from configs.schema import RunConfig
from launch.prep.data import load_run_data
from tasks.tiny_model import build_tokenizer


def test_a_one_megabyte_prompt_is_skipped_and_counted(tmp_path):
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1), "solution": f"\\boxed{{{i + 1}}}"} for i in range(6)]
    rows.insert(1, {"problem": "Sum these digits: " + "7 " * 500_000, "answer": "0", "solution": "\\boxed{0}"})
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert path.stat().st_size > 1_000_000
    cfg = RunConfig(data={"task": "file", "path": str(path), "eval_prompts": 2})
    said: list[str] = []
    t0 = time.monotonic()
    data = load_run_data(cfg, build_tokenizer(), tmp_path, need_demos=False, log=said.append)
    assert time.monotonic() - t0 < 60  # ~3 s on one core
    assert data.skipped_prompts == [1]
    assert [it.prompt_index for it in data.train] == [0, 2, 3, 4]
    assert ("[data] 1 of 5 training prompts are longer than data.max_prompt_tokens=256 tokens and are skipped — "
            "raise data.max_prompt_tokens to keep them") in said
