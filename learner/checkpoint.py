"""Checkpoints: HF-format weights that transformers and vLLM load directly, plus exact-resume state.

Layout of `checkpoints/step_<N>/`:
  config.json, generation_config.json, model.safetensors, tokenizer files   (HF; weights in the
      master dtype, fp32, so a resume is exact; config's dtype is the run's compute dtype, so vLLM
      serves it in bf16 when the run trains in bf16)
  train_state/optimizer.safetensors   full (unsharded) AdamW moments keyed "<hf param name>::<state key>"
  train_state/rng/rank_<r>.{safetensors,json}   torch/CUDA/numpy/python RNG states of each rank
      (in a subdirectory: vLLM loads every *.safetensors file at the top level as weights)
  learner_state.json           step counters, versions, world size, algorithm (written last)
  extra_state.json             free-form JSON the orchestrator passes (buffer snapshot, data cursor)
  <provider>/...               auxiliary-model state (e.g. the PRIME PRM: weights, optimiser, version)
Everything is unsharded, so a run may resume on a different number of ranks. Nothing is pickled.

Atomicity: ranks write into `.step_<N>.tmp` beside the target; after a barrier rank 0 fsyncs and
renames it into place (an older directory of the same name is moved aside first and removed after).
A crash before the rename leaves the previous checkpoints untouched; `latest_checkpoint` ignores
temporary directories and directories without `learner_state.json`.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from learner.fsdp import copy_full_into, ensure_sharded, full_state_on_rank0, hf_name

STATE_FILE = "learner_state.json"
TRAIN_STATE = "train_state"


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@contextmanager
def atomic_dir(final: Path, rank: int) -> Iterator[Path]:
    """Yield a temporary directory every rank writes into; on exit it replaces `final` atomically."""
    final = Path(final)
    tmp = final.parent / f".{final.name}.tmp"
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in list(final.parent.glob(".*.tmp")) + list(final.parent.glob(".*.old")):
            shutil.rmtree(stale, ignore_errors=True)  # left by a crash mid-save
        tmp.mkdir()
        (tmp / TRAIN_STATE).mkdir()
    _barrier()
    try:
        yield tmp
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier()
    if rank == 0:
        _fsync_tree(tmp)
        old = final.parent / f".{final.name}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_checkpoint(checkpoints_dir: str | Path) -> Path | None:
    """The complete `step_<N>` directory with the largest N, or None."""
    best = None
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return None
    for d in root.iterdir():
        m = re.fullmatch(r"step_(\d+)", d.name)
        if m and (d / STATE_FILE).is_file() and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), d)
    return None if best is None else best[1]


def write_json(path: Path, data: dict, what: str) -> None:
    try:
        text = json.dumps(data, indent=1, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be JSON-serialisable: {e}") from None
    path.write_text(text + "\n")


def save_hf_model(module: torch.nn.Module, directory: Path, rank: int, *, config, dtype: torch.dtype,
                  generation_config=None, tokenizer=None) -> None:
    """HF directory of a (sharded) model: every rank gathers, rank 0 writes."""
    tensors = full_state_on_rank0(module, rank)
    if rank != 0:
        return
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = copy.deepcopy(config)
    cfg.dtype = dtype
    cfg.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def load_hf_weights(module: torch.nn.Module, directory: Path) -> None:
    """Load `model.safetensors` (or its shards) of an HF directory into a sharded model."""
    from learner.fsdp import load_full_state

    files = sorted(Path(directory).glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no model*.safetensors in {directory}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    load_full_state(module, tensors, what=str(directory))


def save_optimizer(opt: torch.optim.Optimizer, module: torch.nn.Module, path: Path, rank: int) -> None:
    """Full AdamW state as safetensors on rank 0 (every rank must call: the moments are gathered)."""
    out: dict[str, torch.Tensor] = {}
    ensure_sharded(module)
    for name, p in module.named_parameters():
        for key, value in sorted(opt.state.get(p, {}).items()):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {name}::{key} is not a tensor ({type(value).__name__})")
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            if rank == 0:
                out[f"{hf_name(name)}::{key}"] = full.detach().to("cpu", copy=True).contiguous()
    if rank == 0:
        save_file(out, str(path))


@torch.no_grad()
def load_optimizer(opt: torch.optim.Optimizer, module: torch.nn.Module, path: Path) -> None:
    """Restore what `save_optimizer` wrote into the (sharded) optimiser state."""
    saved = load_file(str(path))
    ensure_sharded(module)
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        keys = [k for k in saved if k.split("::")[0] == hf_name(name)]
        if not keys:
            if saved:
                raise KeyError(f"{path} has no optimizer state for {hf_name(name)}")
            continue
        state = {}
        for k in keys:
            key, full = k.split("::", 1)[1], saved[k]
            if full.dim() == 0:
                state[key] = full.clone()
            else:
                t = torch.zeros_like(p, memory_format=torch.preserve_format)
                copy_full_into(t, full)
                state[key] = t
        opt.state[p] = state


def save_rng(directory: Path, rank: int) -> None:
    d = directory / TRAIN_STATE / "rng"
    d.mkdir(parents=True, exist_ok=True)
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    save_file(tensors, str(d / f"rank_{rank}.safetensors"))
    write_json(d / f"rank_{rank}.json", {"python": _listify(random.getstate()),
                                         "numpy": [name, int(pos), int(has_gauss), float(cached)]}, "rng state")


def load_rng(directory: Path, rank: int) -> bool:
    """Restore this rank's RNG states; False when the checkpoint has none for this rank."""
    d = directory / TRAIN_STATE / "rng"
    if not (d / f"rank_{rank}.safetensors").is_file():
        return False
    tensors = load_file(str(d / f"rank_{rank}.safetensors"))
    meta = json.loads((d / f"rank_{rank}.json").read_text())
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(_tuplify(meta["python"]))
    return True


def _listify(x):
    return [_listify(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x
