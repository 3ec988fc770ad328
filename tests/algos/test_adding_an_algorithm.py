"""docs/algorithms.md, "Adding an algorithm", followed literally: its two files are written into a copy of
the source tree, and the new algorithm is then validated, shown by --dry-run, and trained on a tiny batch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import sys

from configs.loading import dump_annotated, resolve

cfg = resolve("toy")  # configs/toy.yaml, as `algo-train --algo toy` resolves it
assert cfg.toy.scale == 0.5, cfg.toy
shown = dump_annotated(cfg)  # what --dry-run prints
assert "toy:  # --algo toy options" in shown and "  scale: 0.5  # multiplies the reward" in shown, shown
assert "grpo:" not in shown  # only the run's own algorithm section
assert "torch" not in sys.modules, "validating and showing the config imported torch"

import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext, StepBatch

spec = algos.get("toy")
mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
batch = StepBatch(response_mask=mask, prefix_mask=torch.zeros(2, 2, dtype=torch.bool),
                  group_index=torch.tensor([0, 0]), rewards=torch.tensor([1.0, 0.0]),
                  old_logprobs=torch.zeros(2, 2), behav_logprobs=torch.zeros(2, 2))
logprobs = torch.tensor([[-0.5, -1.5], [-2.0, 0.0]], requires_grad=True)
ctx = LossContext(logprobs=logprobs, entropy=None, batch=batch, advantages=torch.zeros(2, 2),
                  norm=LossNorm.local(mask))
(component,) = spec.losses
term = component.fn(ctx, cfg)
# rows: −0.5·1·(−0.5 − 1.5) = 1.0 and −0.5·0·(−2.0) = 0; mean over the 2 rows = 0.5
assert abs(float(term.loss) - 0.5) < 1e-6, term.loss
assert term.summed == {"toy/loss"}
term.loss.backward()
# d/dlogp of the row mean: −0.5·r_i·M / 2 → row 0: −0.25 on both tokens; row 1 (r = 0): 0
assert torch.allclose(logprobs.grad, torch.tensor([[-0.25, -0.25], [0.0, 0.0]])), logprobs.grad
print("toy ok")
'''


def _block(doc: str, first_line: str, lang: str) -> str:
    """The fenced code block of `doc` in `lang` whose first line is `first_line` (without that line)."""
    for body in re.findall(rf"```{lang}\n(.*?)```", doc, flags=re.S):
        if body.startswith(first_line + "\n"):
            return body.split("\n", 1)[1]
    raise AssertionError(f"docs/algorithms.md has no {lang} block starting with {first_line!r}")


def test_the_documented_procedure_adds_an_algorithm(tmp_path):
    doc = (ROOT / "docs" / "algorithms.md").read_text()
    tree = tmp_path / "src"
    for package in ("algos", "configs"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "algos" / "toy").mkdir()
    (tree / "algos" / "toy" / "options.py").write_text(_block(doc, "# algos/toy/options.py", "python"))
    (tree / "configs" / "toy.yaml").write_text(_block(doc, "# configs/toy.yaml", "yaml"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "toy ok" in done.stdout
