"""vLLM weight-transfer engine "gloo": receives packed weight buckets from ``WeightSender``'s gloo plane.

Why: vLLM's native weight-transfer API (``init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``) ships NCCL and CUDA-IPC engines only. This engine
plugs into the same API through ``WeightTransferEngineFactory`` (registered by
``weightsync.plugin`` via the ``vllm.general_plugins`` entry point, which vLLM loads in every process,
including the worker that owns the model), so CPU-only CI runs the exact code path the GPU
deployment runs, with gloo in place of NCCL.

It lives in the vLLM worker process. Per push the worker is driven by the actor-side helper
(``weightsync.receiver``) through the engine client RPCs:
  start_weight_update   -> vLLM layerwise reload begins (parameters go to meta, loaders buffer);
  update_weights        -> receive buckets until the one flagged ``last`` and feed each to
                           ``model.load_weights`` (HF names; vLLM fuses q/k/v, gate/up itself);
                           a delta push (``weightsync.delta``) patches the mirror instead, then
                           loads every tensor of the mirror;
  finish_weight_update  -> vLLM finalises the reload (re-runs CPU GEMM weight packing etc).
An adapter push (``adapter_dir`` in the update info: a LoRA run's `model.lora.sync: adapter`) loads nothing
into the model: its tensors (peft names) are written to ``adapter_dir/adapter_model.safetensors``, and the
actor registers that folder with vLLM as the adapter of the push's version (``actors.adapters``). The base
weights are never touched, so the reload starts lazily, with the first bucket of a push that loads weights.
A plain in-place ``load_weights`` would not be enough on CPU: vLLM pre-packs linear weights (oneDNN /
sgl kernels) after loading, so only the reload lifecycle makes the new weights visible. For the same
reason patches cannot be applied to the parameters in place: with ``mirror`` set (the sender runs in
delta mode) the engine keeps the tensors of the last dense push (checkpoint names, wire dtype, CPU:
one more copy of the weights), applies each delta to them and reloads from them. A failed push
drops the mirror, so a later delta is refused until the next dense push (a new sender's first).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from weightsync.delta import apply_patch
from weightsync.gloo.group import iter_buckets, local_address_toward, new_gloo_group
from weightsync.liveness import Heartbeat, abort_probe
from weightsync.packing import unpack_bucket, unpack_patch_bucket
from weightsync.protocol import (
    WeightSyncError,
    connect_store,
    group_store,
    key_progress,
    key_worker,
    process_info,
    set_json,
)

logger = logging.getLogger(__name__)


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    host: str
    port: int
    prefix: str  # the group's secret key prefix (protocol.group_prefix), given to admitted receivers
    rank: int
    world_size: int
    timeout_s: float = 60.0
    connect_timeout_s: float = 300.0
    mirror: bool = False  # keep the last dense push to apply deltas to


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    version: int
    seq: int
    delta: bool = False  # the buckets hold patches of the mirror, not full tensors
    adapter_dir: str | None = None  # a LoRA adapter push: written here (ADAPTER_WEIGHTS), the model untouched


ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file name, what vLLM's LoRA loader reads


def save_adapter(tensors: dict[str, torch.Tensor], folder: str | Path) -> Path:
    """Write an adapter push's tensors (peft names) to `folder`/adapter_model.safetensors, atomically (a
    reader never sees half a file); each tensor is copied out of the bucket it arrived in."""
    path = Path(folder) / ADAPTER_WEIGHTS
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(tmp),
              metadata={"format": "pt"})
    os.replace(tmp, path)
    return path


def _tied_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules whose own (non-empty) parameters share storage with another module's."""
    owners: dict[int, list[torch.nn.Module]] = {}
    for layer in model.modules():
        for p in layer.parameters(recurse=False):
            if p.numel() and not p.is_meta:
                owners.setdefault(p.untyped_storage().data_ptr(), []).append(layer)
    tied: list[torch.nn.Module] = []
    for layers in owners.values():
        if len(layers) > 1:
            tied += [m for m in layers if all(m is not t for t in tied)]
    return tied


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: WeightTransferConfig, vllm_config, device: torch.device, model: torch.nn.Module):
        super().__init__(config, vllm_config, device, model)
        self._pg = None
        self._store = None
        self._heartbeat: Heartbeat | None = None
        self._info: GlooWeightTransferInitInfo | None = None
        self._mirror: dict[str, torch.Tensor] | None = None
        self._reload_active = False

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        if self.parallel_config.world_size != 1:
            # Each worker would need its own rank in the transfer group; not needed on CPU actors.
            raise NotImplementedError("the gloo weight-transfer engine supports one worker per engine (TP=PP=1)")
        self.shutdown()
        self._info = init_info
        self._store = group_store(connect_store(init_info.host, init_info.port, init_info.connect_timeout_s),
                                  init_info.prefix)
        set_json(self._store, key_worker(init_info.rank), process_info(f"gloo rank {init_info.rank}"))
        self._heartbeat = Heartbeat(init_info.host, init_info.port, init_info.rank, init_info.prefix)
        self._pg = new_gloo_group(self._store, init_info.rank, init_info.world_size, init_info.timeout_s,
                                  local_host=local_address_toward(init_info.host, init_info.port),
                                  connect_timeout_s=init_info.connect_timeout_s)
        logger.info("gloo weight transfer: rank %d/%d joined %s:%d", init_info.rank, init_info.world_size,
                    init_info.host, init_info.port)

    def start_weight_update(self) -> None:
        """Nothing yet: the layerwise reload starts with the first bucket that loads weights (`_begin_reload`);
        an adapter push loads none."""

    def _begin_reload(self) -> None:
        if not self._reload_active:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            self._reload_active = True

    def finish_weight_update(self) -> None:
        if not self._reload_active:
            return
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        self._reload_active = False
        self._reprocess_tied_layers()

    def _reprocess_tied_layers(self) -> None:
        """Re-run weight post-processing on layers that share a parameter with another layer.

        With tied embeddings the checkpoint carries only ``embed_tokens.weight``; vLLM's reload writes
        it into the shared storage but never re-processes ``lm_head``, which received nothing. On CPU
        that processing built a packed GEMM handle from the *old* values (``cpu_linear``), so without
        this step the logits keep using the old output embedding."""
        for layer in _tied_layers(self.model):
            method = getattr(layer, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(layer)

    def update_weights(self, update_info: dict) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on a CPU-only torch
        # ("Cannot access accelerator device when none is available"); gloo is synchronous anyway.
        typed = self.parse_update_info(update_info)
        try:
            self.receive_weights(typed)
        except BaseException:
            self._abandon_reload()
            raise

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self._pg is None or self._info is None or self._store is None:
            raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        info = self._info
        mirror, self._mirror = self._mirror, None  # valid again only once this push has fully landed
        adapter: dict[str, torch.Tensor] | None = {} if update_info.adapter_dir else None
        if adapter is not None and update_info.delta:
            raise WeightSyncError(f"rank {info.rank}: an adapter push (#{update_info.seq}) is always dense")
        if update_info.delta and mirror is None:
            raise WeightSyncError(f"rank {info.rank}: delta push #{update_info.seq} without a dense push to "
                                  "patch (the engine was not initialised with mirror, or a push failed)")
        if not update_info.delta:
            mirror = {} if info.mirror else None
        index = 0
        with disable_mtp_completeness_check():
            for bucket in iter_buckets(self._pg, info.timeout_s,
                                       aborted=abort_probe(self._store, update_info.seq)):
                h = bucket.header
                if (h.seq, h.version, h.index) != (update_info.seq, update_info.version, index):
                    raise WeightSyncError(
                        f"rank {info.rank}: expected bucket {index} of push #{update_info.seq} "
                        f"(version {update_info.version}), got bucket {h.index} of push #{h.seq} "
                        f"(version {h.version})"
                    )
                if update_info.delta:
                    for name, shape, indices, values in unpack_patch_bucket(h, bucket.payload):
                        base = mirror.get(name)
                        if base is None or list(base.shape) != shape:
                            raise WeightSyncError(f"rank {info.rank}: patch of {name!r} {shape} does not match "
                                                  f"the last dense push")
                        apply_patch(base, indices, values)
                elif adapter is not None:
                    adapter.update((name, t.clone()) for name, t in unpack_bucket(h, bucket.payload))
                else:
                    weights = unpack_bucket(h, bucket.payload)
                    if weights:
                        self._begin_reload()
                        self.model.load_weights(weights)
                    if mirror is not None:
                        mirror.update(weights)
                self._store.add(key_progress(h.seq, info.rank), 1)
                index += 1
            if update_info.delta:
                self._begin_reload()
                self.model.load_weights(list(mirror.items()))
        if adapter is not None:
            save_adapter(adapter, update_info.adapter_dir)
            mirror = None  # the engine's weights are the base: a later delta has nothing to patch
        self._mirror = mirror

    def _abandon_reload(self) -> None:
        """A push failed half-way. Put the pre-update tensors back into every layer that had not been
        completely reloaded, so the engine keeps serving (layers already reloaded keep the new
        weights: the model is then a mix of two versions until the next successful push; the
        actor-side helper labels the engine ``weightsync.receiver.NO_VERSION`` before it resumes, so
        nothing sampled meanwhile is trained). Uses vLLM's reload internals."""
        if not self._reload_active:
            return
        self._reload_active = False
        try:
            from vllm.model_executor.model_loader.reload import layerwise as lw

            for layer in self.model.modules():
                info = lw.get_layerwise_info(layer)
                if not info.can_load():
                    continue
                for param in lw.get_layer_tensors(layer).values():
                    param.weight_loader = lw._get_original_loader(param)
                if info.kernel_tensors is not None:
                    lw._place_kernel_tensors(layer, info)
                info.reset()
            if hasattr(self.model, "_original_do_torchao_reload"):
                self.model._do_torchao_reload = self.model._original_do_torchao_reload
            lw.LOADING_LAYERS.clear()
        except Exception:
            logger.exception("could not restore the model after a failed weight push")

    def shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.abort()
            self._pg = None
        self._store = None
        self._mirror = None

