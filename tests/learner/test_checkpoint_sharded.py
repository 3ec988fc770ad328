"""Sharded checkpoints across world sizes: each of 2 gloo ranks writes its own shards; a checkpoint of 1
rank resumes on 2 and one of 2 ranks on 1, with the same weights and AdamW state; the HF export of a
2-rank checkpoint holds the full weights."""

import math

import numpy as np
import pytest
from safetensors import safe_open

from learner import checkpoint
from learner.checkpoint import export_hf
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups
from tests.learner.local_ranks import LearnerGroup

pytestmark = pytest.mark.slow


def _shard_files(path) -> dict[str, int]:
    """{rank's file prefix "shard-<r+1>": how many tensor elements its files hold} of a checkpoint's policy/."""
    out: dict[str, int] = {}
    for f in sorted((path / "policy").glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            n = sum(math.prod(h.get_slice(k).get_shape()) for k in h.keys())  # noqa: SIM118 (not a dict)
        out[f.name[:len("shard-00001")]] = out.get(f.name[:len("shard-00001")], 0) + n
    return out


def test_one_rank_checkpoint_resumes_on_two_and_back(tiny_dir, tokenizer, tmp_path):
    cfg = make_cfg("grpo", learner={"batch_prompts": 4})
    data = [make_groups(tokenizer, 4, 4, version=s, seed=s) for s in range(3)]
    one = Learner(cfg, 0, 1, tiny_dir)
    one.step(data[0], version=0)
    saved_one = one.save(tmp_path / "one")
    after_one = one.step(data[1], version=1)
    w_one = full_weights(one)

    with LearnerGroup(cfg, 2, str(tiny_dir), timeout_s=300) as group:
        group.load(saved_one)  # 1 → 2 ranks: each takes its rows of every tensor and of the moments
        after_two = group.step(data[1], version=1)
        w_two = group.call(full_weights)[0]
        saved_two = group.save(tmp_path / "two")

    for k in ("loss/total", "optim/grad_norm"):
        assert after_two[k] == pytest.approx(after_one[k], rel=1e-5), k
    for k, v in w_one.items():  # wrong or missing Adam moments would move weights by ~lr = 1e-3
        np.testing.assert_allclose(w_two[k], v, atol=3e-5, rtol=0, err_msg=k)
    files_one, files_two = _shard_files(saved_one), _shard_files(tmp_path / "two")
    # every rank wrote its own files; FSDP2 splits dim 0 evenly, so each holds about half of the elements
    # (the 0-dim AdamW step counters are written once, by one rank)
    assert list(files_one) == ["shard-00001"]
    assert len(list((saved_one / "policy").glob("*.safetensors"))) == checkpoint.SAVE_FILES  # in parallel
    assert len(files_two) == 2 and sum(files_two.values()) == sum(files_one.values())
    assert all(abs(n / sum(files_two.values()) - 0.5) < 0.05 for n in files_two.values()), files_two

    export = export_hf(saved_two, tmp_path / "hf")  # the HF export gathers the pieces of both ranks
    with safe_open(str(export / "model.safetensors"), framework="pt") as h:
        exported = {k: h.get_tensor(k).double().numpy() for k in h.keys()}  # noqa: SIM118 (not a dict)
    assert sorted(exported) == sorted(w_two)  # the tied lm_head once, as embed_tokens
    for k, v in exported.items():
        np.testing.assert_array_equal(v, w_two[k], err_msg=k)

    back = Learner(cfg, 0, 1, tiny_dir)
    back.load(saved_two)  # 2 → 1 rank
    assert back.optimizer_steps == 2
    for k, v in full_weights(back).items():
        np.testing.assert_array_equal(v, w_two[k], err_msg=k)
    state = [back.opt.state[p] for p in back.params]
    assert all(float(s["step"]) == 2.0 for s in state) and all(s["exp_avg_sq"].abs().sum() > 0 for s in state)
