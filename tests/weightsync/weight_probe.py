"""Reads a vLLM (CPU) worker's weights as its forward pass uses them, for bit-exact checks of pushes.

A vLLM worker extension (``AsyncEngineArgs(worker_extension_cls=PROBE)``), called as
``engine.collective_rpc("save_weights", args=(path,))``: the worker writes ``{vLLM name: tensor}`` to
``path`` with ``torch.save``. On CPU vLLM packs each linear layer's weight into a GEMM handle and
empties ``layer.weight`` (``dispatch_cpu_unquantized_gemm``), so a linear weight W (N x K) is read
back through the layer's own kernel: the identity I (K x K, in the layer's dtype) gives I Wᵀ = Wᵀ
exactly (one nonzero product per output, accumulated in fp32). Other parameters (embeddings, norms)
are read as they are. Names are vLLM's (fused ``qkv_proj``, ``gate_up_proj``).
"""

from __future__ import annotations

import torch

PROBE = "tests.weightsync.weight_probe.WeightProbe"


class WeightProbe:
    @torch.no_grad()
    def save_weights(self, path: str) -> None:
        out = {}
        for mod_name, m in self.get_model().named_modules():
            for p_name, p in m.named_parameters(recurse=False):
                name = f"{mod_name}.{p_name}"
                if p.numel():
                    out[name] = p.detach().clone()
                elif p_name == "weight" and hasattr(m, "input_size_per_partition"):  # a packed linear layer
                    eye = torch.eye(m.input_size_per_partition, dtype=self.model_config.dtype)
                    out[name] = m.quant_method.apply(m, eye).t().contiguous()
        torch.save(out, path)
