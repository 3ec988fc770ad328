"""learner.gather.serving_weights: the serving-dtype weights the weight sync pushes. On FSDP2 over 2 gloo
ranks with a bf16 MixedPrecisionPolicy (the unit all-gathers in bf16) they equal the fp32 masters
(one full_tensor() each) cast to bf16 bit for bit, under the same HF names, decoder blocks first; and
every tensor is a copy, never a view of a live parameter."""

import pytest
import torch

from learner.gather import serving_weights
from tests.learner.helpers import make_cfg
from tests.learner.local_ranks import LearnerGroup

pytestmark = pytest.mark.slow


def _served_vs_masters(learner) -> dict:
    served = list(learner.named_full_weights(torch.bfloat16))
    masters = dict(learner.named_full_weights())  # fp32, per parameter
    try:
        list(learner.named_full_weights(torch.float32))
        refused = ""
    except ValueError as e:  # more precision than the bf16 policy gathers
        refused = str(e)
    return {"names": [n for n, _ in served], "masters": list(masters), "refused": refused,
            "dtypes": {str(t.dtype) for _, t in served},
            "exact": all(torch.equal(t.view(torch.int16), masters[n].to(torch.bfloat16).view(torch.int16))
                         for n, t in served)}


def test_fsdp_serving_weights_equal_masters_cast_to_bf16(tiny_dir):
    cfg = make_cfg("grpo", model={"dtype": "bfloat16"})
    with LearnerGroup(cfg, 2, str(tiny_dir), timeout_s=300) as group:
        ranks = group.call(_served_vs_masters)
    for r in ranks:
        assert r["exact"] and r["dtypes"] == {"torch.bfloat16"}
        assert sorted(r["names"]) == sorted(r["masters"])  # same HF names, tied lm_head once
        assert r["names"][0].startswith("model.layers.0.")  # decoder blocks first, the root's own last
        assert r["names"][-1] in ("model.embed_tokens.weight", "model.norm.weight")
        assert "cannot give exact torch.float32" in r["refused"]
    assert ranks[0]["names"] == ranks[1]["names"]


def test_unsharded_serving_weights_are_copies(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    served = dict(serving_weights(model, torch.bfloat16))
    fp32 = dict(serving_weights(model, torch.float32))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the optimiser moves on while a push is in flight
    assert sorted(served) == sorted(fp32) == sorted(before) and "lm_head.weight" not in served  # tied: once
    for name, t in served.items():
        assert torch.equal(t, before[name].to(torch.bfloat16)) and torch.equal(fp32[name], before[name]), name
