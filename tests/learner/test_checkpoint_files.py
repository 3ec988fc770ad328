"""A rank's sharded checkpoint is written as several files of about equal bytes, by several threads at
once (DCP's HF writer gives each thread whole files, so one file per rank was one writer thread), and it
loads back exactly."""

import math
import threading

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from learner import checkpoint


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(10)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 32)).square().sum().backward()
    opt.step()
    return model, opt


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, as meant
def test_a_rank_writes_equal_files_by_several_threads_and_loads_them_back(tmp_path, monkeypatch):
    model, opt = _trained(0)
    met = threading.Barrier(2, timeout=10)  # the first two files must be in serialisation at the same time
    calls, lock, real = [], threading.Lock(), safetensors.torch.save

    def save(tensors, metadata=None):  # DCP imports it at each file write (torch filesystem.py)
        with lock:
            calls.append(threading.get_ident())
            first_two = len(calls) <= 2
        if first_two:
            met.wait()
        return real(tensors, metadata)

    monkeypatch.setattr(safetensors.torch, "save", save)
    checkpoint.save_sharded(tmp_path, model, opt)
    monkeypatch.undo()

    sizes = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            sizes[f.name] = sum(math.prod(h.get_slice(k).get_shape()) * 4 for k in h.keys())  # noqa: SIM118
    # 10 layers x (weight 32*32*4 = 4096 B, bias 32*4 = 128 B) x (parameter, exp_avg, exp_avg_sq) and
    # 20 step counters of 4 B = 30*4096 + 30*128 + 20*4 = 126800 B, dealt largest first onto the lightest
    # of 8 files: the 30 weights give six files 4*4096 = 16384 and two 3*4096 = 12288; the 128 B biases
    # fill those two (15 each, +1920) and the counters follow (10 each, +40): 12288 + 1920 + 40 = 14248
    assert list(sizes) == [f"shard-00001-model-{i:05d}-of-00008.safetensors" for i in range(1, 9)]
    assert sorted(sizes.values()) == [14248] * 2 + [16384] * 6 and sum(sizes.values()) == 126800
    assert len(calls) == 8 and len(set(calls)) >= 2

    fresh, fresh_opt = _trained(1)
    checkpoint.load_sharded(tmp_path, fresh, fresh_opt)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key]), key
