"""The learner on CUDA (tiny model, one rank, NCCL): a bf16 FSDP2 step, packed micro-batches, and the
weight stream (gather, cast to bf16, pack into buckets). Skipped where torch sees no GPU."""

import numpy as np
import pytest
import torch

from learner import batching
from learner.distributed import init_distributed
from learner.fsdp import build_scorer, make_mesh
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups
from weightsync.packing import pack_buckets, unpack_bucket

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda", 0)


def _learner(tiny_dir, dtype: str = "bfloat16", **learner) -> Learner:
    return Learner(make_cfg("grpo", model={"dtype": dtype}, learner=learner), 0, 1, tiny_dir, device=CUDA, fsdp=True)


def test_bf16_fsdp2_step_on_cuda(tiny_dir, tokenizer):
    """bf16 compute on fp32 FSDP2 masters, activation checkpointing on by default (auto on CUDA), packed
    and padded: the step moves every weight and its gradient norm is within bf16 rounding (3e-2, as on
    CPU in test_learner_algos) of the fp32 step's."""
    groups = make_groups(tokenizer, 2, 4)
    norms = {}
    for dtype, packing in (("float32", True), ("bfloat16", True), ("bfloat16", False)):
        learner = _learner(tiny_dir, dtype, packing=packing)
        assert learner.activation_checkpointing and learner.policy.lm.is_gradient_checkpointing
        w0 = full_weights(learner)
        m = learner.step(groups, 0)
        assert all(np.isfinite(v) for v in m.values())
        assert {(t.dtype, t.device.type) for _, t in learner.named_full_weights()} == {(torch.float32, "cuda")}
        w1 = full_weights(learner)
        assert all(np.abs(w1[k] - w0[k]).max() > 1e-5 for k in w0)  # Adam, lr 1e-3: every tensor moves
        norms[dtype, packing] = m["optim/grad_norm"]
    for key in (("bfloat16", True), ("bfloat16", False)):
        assert norms[key] == pytest.approx(norms["float32", True], rel=3e-2) and norms[key] != norms["float32", True]


def test_packed_logprobs_equal_padded_on_cuda(tiny_dir, tokenizer):
    """fp32 on CUDA: one packed micro-batch of 12 rows of mixed lengths gives the padded log-probs within
    1e-4 (only kernel shapes differ: per-row causal SDPA vs one masked call)."""
    init_distributed(0, 1, CUDA)
    scorer = build_scorer(tiny_dir, mesh=make_mesh(CUDA, 1), device=CUDA, dtype="float32", trainable=False,
                          chunk_tokens=64)
    rows = batching.rows_from_groups(make_groups(tokenizer, 3, 4))
    out = {}
    with torch.no_grad():
        for packed in (False, True):
            mb = batching.make_microbatch(rows, list(range(len(rows))), 0, CUDA, packed=packed)
            out[packed] = mb.scatter(scorer(**mb.inputs())[0])
    assert out[True].is_cuda and out[True].shape == (12, max(len(r.response) for r in rows))
    torch.testing.assert_close(out[True], out[False], atol=1e-4, rtol=0)


def test_full_weights_gather_cast_and_pack_on_cuda(tiny_dir):
    """The weight-sync stream: full tensors gathered from the FSDP2 shards, cast to bf16 on the GPU, packed
    into 64 KiB buckets and unpacked equal the fp32 masters cast to bf16; tied embeddings go once."""
    learner = _learner(tiny_dir)
    masters = {k: v.cpu() for k, v in learner.named_full_weights()}
    cast = list(learner.named_full_weights(torch.bfloat16))
    assert {(t.dtype, t.device.type) for _, t in cast} == {(torch.bfloat16, "cuda")}
    buckets = list(pack_buckets(iter(cast), 64 * 1024))
    got = {n: t for b in buckets for n, t in unpack_bucket(b.header, b.payload)}
    assert len(buckets) > 1 and got.keys() == masters.keys()
    assert "model.embed_tokens.weight" in got and "lm_head.weight" not in got
    for k, v in masters.items():
        assert torch.equal(got[k], v.to(torch.bfloat16)), k
