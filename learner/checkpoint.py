"""Checkpoints: sharded exact-resume state that every rank writes itself, one commit marker, rotation,
and HF exports of the policy that transformers and vLLM load.

Layout of `checkpoints/step_<N>/`:
  policy/shard-<r+1>-model-<i>-of-<k>.safetensors       rank r's pieces of the policy (`save_sharded`):
      "model.<fqn>" fp32 master weights, "optim.state.<fqn>.<key>" AdamW moments and step counter, in
      k <= SAVE_FILES files of about equal bytes, each written by a thread of its own
  prime_prm/shards/..., prime_prm/prm_state.json        an auxiliary trainable model's (PRIME's PRM), same form
  rng/rank_<r>.{safetensors,json}                        each rank's torch/CUDA/numpy/python RNG states
  hf_config/                                             config.json (dtype = the serving dtype),
                                                         generation_config.json, tokenizer files (for `export_hf`)
  extra_state.json                                       the caller's JSON (driver: learner steps taken = the
                                                         weight version, ledger, snapshot name)
  learner_state.json                                     algorithm, optimiser steps, skipped steps, world size,
                                                         providers (learner, written last)
  buffer.msgpack                                         the buffer snapshot (driver)
  COMMITTED                                              written last, by `commit`: the checkpoint is complete
An export (`export_hf`, the driver writes `<run>/hf/step_<N>/`): config, tokenizer and the policy's
weights in the serving dtype, as `model.safetensors` or `model-<i>-of-<n>.safetensors` + index.

Sharding: `torch.distributed.checkpoint` (DCP) with its HF safetensors storage: each rank writes the
shards it holds into a file of its own (one file per rank and directory), whose safetensors header
records, in JSON, where each piece sits in the full tensor; a reader of any world size maps the pieces
it needs from those offsets (resharding: a run may resume on another number of ranks). Nothing is
pickled — a deviation from DCP's default storage, whose `.metadata` file and non-tensor entries are
pickles. The price: only tensors are stored, so the optimiser's param_groups are not (every value in
them comes from the config, and the LR is written by the schedule before each step, `learner.optim`).
Tied parameters (embeddings) are stored once, under the name `named_parameters` keeps.

Completeness: the learner writes its part into a directory (`Learner.save`; ranks wait for each
other, then rank 0 writes learner_state.json); the driver stages a checkpoint in `.step_<N>.tmp`
(`stage`), adds the buffer snapshot and calls `commit`, which fsyncs everything, writes COMMITTED
and renames the directory into place. `latest_checkpoint` and a resume count a directory only with
COMMITTED, so a crash at any point leaves the previous checkpoints as they were. Re-saving a step that
already has a checkpoint swaps the old one out with two renames (the old one is gone only between them).
`rotate` keeps the newest K; it removes a checkpoint's marker before its files.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from learner.committed import COMMITTED, committed_steps
from learner.fsdp import ensure_sharded, hf_name
from learner.lora import ADAPTER_CONFIG, export_adapter

STATE_FILE = "learner_state.json"
EXPORT_SHARD_BYTES = 2 << 30  # an export's weights files hold at most this many bytes each (serving dtype)
SAVE_FILES = 8  # a rank writes its sharded state into at most this many files, one writer thread each


def optimizer_steps(state: dict) -> int:
    """The optimiser steps of a learner_state.json; checkpoints before format 3 called them "step"."""
    if "optimizer_steps" in state:
        return int(state["optimizer_steps"])
    if "step" in state:
        return int(state["step"])
    raise ValueError(f"{STATE_FILE} holds no optimizer_steps (nor the older 'step'): keys {sorted(state)}")


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def write_json(path: Path, data: dict, what: str) -> None:
    try:
        text = json.dumps(data, indent=1, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be JSON-serialisable: {e}") from None
    path.write_text(text + "\n")


# ---------------------------------------------------------------------- directories, commit, rotation
def prepare_dir(path: Path, rank: int) -> None:
    """Rank 0 creates `path` (which must not exist or be empty); every rank must call it."""
    if rank == 0:
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"{path} is not empty: a checkpoint is written into a new directory (the driver "
                                  f"stages it in .step_<N>.tmp and commits it, learner.checkpoint.stage/commit)")
        path.mkdir(parents=True, exist_ok=True)
    _barrier()


def finish_learner_part(path: Path, rank: int, state: dict) -> None:
    """After every rank has written its files, rank 0 writes learner_state.json (the learner's part is
    complete); every rank must call it."""
    _barrier()
    if rank == 0:
        write_json(path / STATE_FILE, state, "learner state")
    _barrier()


def stage(final: Path) -> Path:
    """An empty staging directory `.step_<N>.tmp` beside `final` (leftovers of a crashed save removed)."""
    staged = final.parent / f".{final.name}.tmp"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def commit(staged: Path, final: Path) -> Path:
    """Make the staged checkpoint `final`: fsync its files, write COMMITTED (last), rename into place.
    One process calls it (the driver), after everything the checkpoint holds is in `staged`."""
    _fsync_tree(staged)
    marker = staged / COMMITTED
    marker.write_text(final.name + "\n")
    _fsync_file(marker)
    _fsync_dir(staged)
    old = final.parent / f".{final.name}.old"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(staged, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(checkpoints_dir: str | Path) -> Path | None:
    """The committed `step_<N>` directory with the largest N, or None."""
    found = committed_steps(Path(checkpoints_dir))
    return found[-1][1] if found else None


def rotate(checkpoints_dir: str | Path, keep: int, protect: tuple[Path, ...] = ()) -> list[Path]:
    """Delete committed checkpoints older than the newest `keep` (0 = keep all), except those in `protect`
    (e.g. the one the run resumed from), and leftovers of crashed saves (`.step_*` directories); the
    newest committed one is never deleted. Returns the checkpoints deleted."""
    root = Path(checkpoints_dir)
    found = committed_steps(root)
    kept = {d.resolve() for d in protect} | {d.resolve() for _, d in found[-max(keep, 1):]}
    doomed = [d for _, d in found if keep and d.resolve() not in kept]
    for d in doomed:
        (d / COMMITTED).unlink()  # no longer complete, before any of its files goes
        shutil.rmtree(d)
    for leftover in root.glob(".step_*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return doomed


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            _fsync_file(Path(dirpath) / f)
        _fsync_dir(Path(dirpath))


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- sharded model + optimiser (DCP)
def _clean(fqn: str) -> str:
    """A parameter name as torch's state-dict API writes it (activation-checkpoint and compile wrappers removed)."""
    return fqn.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _tied_aliases(module: torch.nn.Module) -> dict[str, str]:
    """{second name: first name} of parameters registered under several names (tied embeddings)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[_clean(name)] = first[id(p)]
        else:
            first[id(p)] = _clean(name)
    return aliases


def _options(trainable_only: bool) -> StateDictOptions:
    """A LoRA policy's checkpoint holds its trainable tensors only (the adapters; the frozen base is the model
    directory's): frozen parameters are left out, and loading leaves them as they are."""
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def _state(module: torch.nn.Module, opt: torch.optim.Optimizer, with_optim: bool,
           trainable_only: bool = False) -> tuple[dict, dict | None]:
    """(model state dict without tied aliases, optimiser state dict or None): this rank's live tensors
    (DTensor shards under FSDP2, whole tensors for a plain module), keyed by parameter FQN; `trainable_only`:
    the parameters that train (`_options`)."""
    ensure_sharded(module)
    model = get_model_state_dict(module, options=_options(trainable_only))
    for alias in _tied_aliases(module):
        model.pop(alias, None)  # absent when frozen and left out
    return model, (get_optimizer_state_dict(module, opt) if with_optim else None)


def save_sharded(directory: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
                 trainable_only: bool = False) -> None:
    """Every rank writes its shards of `module` and of `opt`'s state into `directory` (a collective).
    An optimiser that has not stepped yet has no state and none is written (asking torch for it would
    run a zero step that changes AdamW's step counter). trainable_only: a LoRA policy's adapters only."""
    model, optim = _state(module, opt, with_optim=bool(opt.state), trainable_only=trainable_only)
    state = {"model": model}
    if optim is not None:
        for fqn, entries in optim["state"].items():
            for key, value in entries.items():
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"optimizer state {fqn}.{key} is a {type(value).__name__}; only tensors are "
                                    "checkpointed")
        state["optim"] = {"state": optim["state"]}
    files = _file_plan(state)
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(
        str(directory), fqn_to_index_mapping=files or None, thread_count=max(files.values(), default=1),
        save_distributed=True))


def _file_plan(state: dict) -> dict[str, int]:
    """{key as DCP flattens it ("model.<fqn>", "optim.state.<fqn>.<key>"): file 1..k}: the tensors dealt
    largest first onto the lightest of k = min(SAVE_FILES, tensors) files, so the files hold about equal bytes.

    Why: DCP's HF writer hands its threads whole files (torch `hf_storage.py` `write_data` queues one
    file per index of this mapping, `filesystem.py` `_write_data` starts `thread_count` threads that each
    take files from that queue), so with one file per rank a 7B checkpoint (~91 GB: fp32 weights and two
    AdamW moments) is copied to the host, serialised and written by one thread per rank, whatever
    `thread_count` says. Sizes are the full tensors' (a DTensor's numel), so every rank plans the same
    files; DCP applies the coordinator's plan to all ranks anyway (`prepare_global_plan`)."""
    flat = {f"model.{k}": v for k, v in state["model"].items()}
    for fqn, entries in state.get("optim", {}).get("state", {}).items():
        flat |= {f"optim.state.{fqn}.{key}": v for key, v in entries.items()}
    order = sorted(flat, key=lambda k: (-flat[k].numel() * flat[k].element_size(), k))
    loads = [0] * min(SAVE_FILES, len(order))
    plan = {}
    for k in order:
        i = loads.index(min(loads))
        plan[k] = i + 1
        loads[i] += flat[k].numel() * flat[k].element_size()
    return plan


def load_sharded(directory: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
                 trainable_only: bool = False) -> None:
    """Restore what `save_sharded` wrote (by any number of ranks) into this rank's shards (a collective).
    A checkpoint without optimiser state leaves `opt` without state, as it was when saved. trainable_only: as
    saved (a LoRA policy's adapters; every one must be in the checkpoint, DCP refuses a missing key)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is missing: not a sharded checkpoint of this format")
    saved = HuggingFaceStorageReader(str(directory)).read_metadata().state_dict_metadata
    with_optim = any(k.startswith("optim.") for k in saved)
    opt.zero_grad(set_to_none=True)  # torch allocates the state to load into only without state and gradients
    opt.state.clear()
    model, optim = _state(module, opt, with_optim, trainable_only)  # with_optim: zero state allocated to load into
    state = {"model": model}
    if optim is not None:
        state["optim"] = {"state": optim["state"]}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(directory), thread_count=SAVE_FILES))
    set_model_state_dict(module, model | {a: model[f] for a, f in _tied_aliases(module).items() if f in model},
                         options=_options(trainable_only))
    if optim is not None:
        set_optimizer_state_dict(module, opt, optim)


# ---------------------------------------------------------------------- RNG
def save_rng(directory: Path, rank: int) -> None:
    d = directory / "rng"
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
    d = directory / "rng"
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


# ---------------------------------------------------------------------- HF export
def save_hf_config(directory: Path, lm: torch.nn.Module, dtype: torch.dtype, tokenizer,
                   code_dir: Path | None = None) -> None:
    """config.json (its dtype = the serving dtype `dtype`), generation_config.json and the tokenizer
    into `directory/hf_config` (rank 0). code_dir: the model directory whose own Python code (a model
    loaded with model.trust_remote_code; its config's `auto_map` names those files) the export must carry
    to load again; save_pretrained copies the config's and tokenizer's modules, not the model's."""
    d = directory / "hf_config"
    cfg = copy.deepcopy(lm.config)
    cfg.dtype = dtype
    cfg.save_pretrained(d)
    if getattr(lm, "generation_config", None) is not None:
        lm.generation_config.save_pretrained(d)
    tokenizer.save_pretrained(d)
    for code in sorted(Path(code_dir).glob("*.py")) if code_dir is not None else ():
        shutil.copyfile(code, d / code.name)


def read_model_tensors(shards: Path, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """{"model.<fqn>": full tensor} of the policy shards `shards` (`save_sharded`), every model tensor or
    `keys`, read in one process (no process group), in their stored dtype."""
    meta = HuggingFaceStorageReader(str(shards)).read_metadata().state_dict_metadata
    keys = sorted(k for k in meta if k.startswith("model.")) if keys is None else keys
    part = {k: torch.empty(meta[k].size, dtype=meta[k].properties.dtype) for k in keys}
    with warnings.catch_warnings():  # DCP warns that no_dist loads in one process: what is meant here
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(part, storage_reader=HuggingFaceStorageReader(str(shards)), no_dist=True)
    return part


def export_hf(checkpoint: str | Path, out: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write the policy of a checkpoint as an HF model directory `out` (replaced atomically).

    Weights in `dtype` (default: the serving dtype, hf_config/config.json's), read piece by piece from
    the rank shards (any world size; at most ~EXPORT_SHARD_BYTES of fp32 tensors in memory at once),
    without a process group. Files beside the weights: hf_config/ of the checkpoint.
    A LoRA policy's checkpoint (it holds adapter_config.json) is written as its adapter in peft's format,
    and the merged model in out/merged/ when its model.lora.export_merged says so (`learner.lora.export_adapter`).
    """
    checkpoint, out = Path(checkpoint), Path(out)
    shards = checkpoint / "policy"
    config = json.loads((checkpoint / "hf_config" / "config.json").read_text())
    dtype = dtype or getattr(torch, config.get("dtype") or "float32")
    if (checkpoint / ADAPTER_CONFIG).is_file():
        lora = json.loads((checkpoint / STATE_FILE).read_text())["lora"]
        return export_adapter(checkpoint, out, dtype, bool(lora["export_merged"]), read_model_tensors(shards))
    meta = HuggingFaceStorageReader(str(shards)).read_metadata().state_dict_metadata
    names = sorted(k for k in meta if k.startswith("model."))
    files: list[list[str]] = [[]]
    size = 0
    for k in names:
        n = meta[k].size.numel() * dtype.itemsize
        if files[-1] and size + n > EXPORT_SHARD_BYTES:
            files.append([])
            size = 0
        files[-1].append(k)
        size += n
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint / "hf_config", tmp)
    weight_map = {}
    for i, keys in enumerate(files, start=1):
        part = read_model_tensors(shards, keys)
        fname = "model.safetensors" if len(files) == 1 else f"model-{i:05d}-of-{len(files):05d}.safetensors"
        tensors = {hf_name(k.removeprefix("model.")): v.to(dtype).contiguous() for k, v in part.items()}
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, fname)
    if len(files) > 1:
        total = sum(meta[k].size.numel() * dtype.itemsize for k in names)
        write_json(tmp / "model.safetensors.index.json", {"metadata": {"total_size": total},
                                                          "weight_map": weight_map}, "export index")
    _fsync_tree(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    _fsync_dir(out.parent)
    return out
