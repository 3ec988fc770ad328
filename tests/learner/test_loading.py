"""Meta-device loading (learner.fsdp.build_scorer): the model each rank builds equals `from_pretrained`'s
bit for bit — weights, recomputed rotary buffers, tied embeddings, log-probs — at 1 and 2 ranks; and
which trainable models get activation checkpointing."""

import pytest
import torch
from torch.distributed.tensor import DTensor

from learner.distributed import init_distributed
from learner.fsdp import build_scorer, load_causal_lm, make_mesh
from learner.learner import Learner
from learner.logprobs import TokenScorer
from tests.learner.helpers import make_cfg
from tests.learner.local_ranks import spawn_ranks

CPU = torch.device("cpu")


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(7, 103, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # one padded row
    positions = torch.tensor([r * 21 + t for r in range(3) for t in range(20) if mask[r, t + 1]])
    return ids, mask, positions, ids.reshape(-1)[positions + 1]


def _logprobs(scorer) -> torch.Tensor:
    with torch.no_grad():
        return scorer(*_batch())[0]


def _new_and_old(model_dir, dtype: str, trainable: bool, shard: bool):
    scorer = build_scorer(model_dir, mesh=make_mesh(CPU, torch.distributed.get_world_size()), device=CPU,
                          dtype=dtype, trainable=trainable, chunk_tokens=16, shard=shard)
    old = TokenScorer(load_causal_lm(model_dir, torch.float32 if trainable else getattr(torch, dtype)),
                      chunk_tokens=16)
    return scorer, old


@pytest.fixture(scope="module")
def split_dir(tiny_dir, tmp_path_factory):
    """The tiny model saved as several safetensors files with an index (as large checkpoints are)."""
    out = tmp_path_factory.mktemp("split") / "tiny_split"
    load_causal_lm(tiny_dir, torch.float32).save_pretrained(out, max_shard_size="1MB")
    for f in tiny_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            (out / f.name).write_bytes(f.read_bytes())
    assert len(list(out.glob("*.safetensors"))) > 1
    return out


@pytest.mark.parametrize("dtype,trainable,shard,split", [
    ("float32", True, False, False), ("float32", True, True, False), ("bfloat16", False, False, False),
    ("bfloat16", False, True, False), ("float32", True, True, True)])
def test_meta_loading_equals_from_pretrained(tiny_dir, split_dir, dtype, trainable, shard, split):
    init_distributed(0, 1, CPU)
    new, old = _new_and_old(split_dir if split else tiny_dir, dtype, trainable, shard)
    lm = new.lm
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # still tied: one parameter
    assert isinstance(lm.lm_head.weight, DTensor) == shard
    assert torch.equal(lm.model.rotary_emb.inv_freq, old.lm.model.rotary_emb.inv_freq)
    old_params = dict(old.named_parameters())
    for name, p in new.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        assert full.dtype == (torch.float32 if trainable else torch.bfloat16), name
        assert torch.equal(full, old_params[name]), name
    assert torch.equal(_logprobs(new), _logprobs(old))
    assert lm.generation_config.eos_token_id == old.lm.generation_config.eos_token_id


def test_buffers_the_initialiser_misses_and_missing_weights_fail_loudly(tiny_dir, tmp_path, monkeypatch):
    init_distributed(0, 1, CPU)
    bare = tmp_path / "no_weights"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no safetensors weights"):
        build_scorer(bare, mesh=make_mesh(CPU, 1), device=CPU, dtype="float32", trainable=False, chunk_tokens=16,
                     shard=False)
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "_init_weights", lambda self, module: None)
    with pytest.raises(RuntimeError, match=r"cannot initialise buffers .*inv_freq.* of model.rotary_emb"):
        build_scorer(tiny_dir, mesh=make_mesh(CPU, 1), device=CPU, dtype="float32", trainable=False,
                     chunk_tokens=16, shard=False)


def _rank_loads_its_rows(rank: int, world_size: int, model_dir: str) -> list[float]:
    init_distributed(rank, world_size, CPU)
    new, old = _new_and_old(model_dir, "float32", True, True)
    old_params = dict(old.named_parameters())
    for name, p in new.named_parameters():
        local, rows = p.to_local(), -(-p.shape[0] // world_size)  # torch.chunk: ceil(rows / world) per rank
        assert torch.equal(local, old_params[name][rank * rows:rank * rows + local.shape[0]]), name
    assert new.lm.lm_head.weight is new.lm.model.embed_tokens.weight
    new_lp = _logprobs(new)
    assert torch.equal(new_lp, _logprobs(old))
    return new_lp.tolist()


@pytest.mark.slow
def test_two_ranks_each_read_their_own_rows(tiny_dir):
    """Every rank's shard holds exactly its torch.chunk rows of the checkpoint (vocab 103: rows 0-51 on
    rank 0, 52-102 on rank 1), and the sharded model's log-probs equal from_pretrained's on every rank."""
    lp0, lp1 = spawn_ranks(_rank_loads_its_rows, 2, str(tiny_dir), timeout_s=300)
    assert lp0 == lp1 and len(lp0) == 54  # 20 + 14 + 20 predicted tokens


def test_activation_checkpointing_goes_to_every_trainable_model(tiny_dir):
    """auto is off on CPU; on, it covers the policy and PRIME's PRM (trainable), not the frozen reference."""
    assert not Learner(make_cfg("grpo"), 0, 1, tiny_dir).policy.lm.is_gradient_checkpointing
    learner = Learner(make_cfg("prime", learner={"activation_checkpointing": True}), 0, 1, tiny_dir)
    assert learner.policy.lm.is_gradient_checkpointing
    assert learner.providers["prime_q"].model.lm.is_gradient_checkpointing
    assert not learner.reference().lm.is_gradient_checkpointing
