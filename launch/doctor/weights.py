"""The weight-path check of `algo-train doctor`: the run's real weight push, end to end, on the run's nodes.

What runs: a small model of the run's architecture (its config.json with `num_hidden_layers` cut to 2, random
weights, the run's tokenizer; the built-in model as it is), written beside the run folder (storage every
node reads). A `WeightPeer` learner holds it and the weight-sync sender where the run's learner rank 0 would
run; one `WeightPeer` engine runs on every node that can host actors: a vLLM engine built as the run's
actors build theirs (`actors.engine.EngineSpec.from_config`: the configured backend's transfer engine,
KV cache, dtype) with the actors' own receiver (`weightsync.receiver.WeightReceiver`). Then:

  full     a dense push (version 1);
  delta    ~1 % of the elements changed, pushed as a delta (version 2) — the learner's sender runs in delta
           mode for the check (a dense push every 2), whatever `weight_sync.mode` says;
  abort    a dense push the sender aborts half-way through its tensors (`unsendable`: one whose data it
           cannot read, on either backend; with the run's `weight_sync.bucket_mb`, a small model may fit one
           bucket): every engine must then serve under no version (`weightsync.receiver.NO_VERSION`, B1 of
           reviews/gpu_path.md), within seconds: the sender fails at once and says so to every engine;
  rejoin   a new weight-sync group (fresh rendezvous, as after an actor restart) and a full push
           (version 4): every engine serves version 4 again (a generated token carries it).

Each becomes a `Check` per engine node with the bytes and bytes/s the sender measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import time
from pathlib import Path

from configs.schema import RunConfig
from launch.doctor.report import Check

SMALL_LAYERS = 2
STEPS = ("full", "delta", "abort", "rejoin")
START_TIMEOUT_S = 600.0  # a GPU engine of a large vocabulary may take minutes to start


def small_model(cfg: RunConfig, out: Path) -> Path:
    """The run's model cut to SMALL_LAYERS decoder layers with random weights, its tokenizer beside it, in
    `out`; the built-in tiny model as it is."""
    from launch.doctor.checks import model_dir

    src = model_dir(cfg)
    if cfg.model.path is None:
        return src
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = min(SMALL_LAYERS, int(config.get("num_hidden_layers", SMALL_LAYERS)))
    config.pop("layer_types", None)  # per-layer lists would no longer match the layer count
    hf = AutoConfig.for_model(**config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, cfg.model.resolved_dtype(gpu=False)))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in src.iterdir():  # the tokenizer and generation settings; not the weights nor their index
        if f.is_file() and f.name != "config.json" and not f.name.endswith((".safetensors", ".bin", ".pt",
                                                                              ".index.json", ".pth")):
            shutil.copy(f, out / f.name)
    return out


class WeightPeer:
    """One end of the check, as a Ray actor: the learner ("learner": the model and the sender) or an engine
    node's vLLM engine with its receiver ("engine")."""

    def __init__(self, cfg: RunConfig, model_dir: str, role: str):
        from launch.processes.roles import to_log_file

        to_log_file()
        self.cfg, self.model_dir, self.role = cfg, model_dir, role
        self.sender = self.host = self.receiver = self._follow = None
        if role == "learner":  # loaded while the engines start
            import torch
            from transformers import AutoModelForCausalLM

            from launch.planning.cluster import joins_cluster
            from launch.processes.roles import rank0_rendezvous
            from learner.distributed import default_device, init_distributed

            gpu = bool(cfg.learner.gpus_per_rank)
            device = default_device(0) if gpu else torch.device("cpu")
            # learner rank 0's own start: its rendezvous address and `init_distributed` (as a group of one),
            # so this process binds, and leaves in its environment (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME),
            # what rank 0's does before it hosts the weight sync; a run that would fail there fails here
            init_distributed(0, 1, device, rank0_rendezvous(cfg.learner.world_size, joins_cluster(cfg)),
                             cfg.learner.collective_timeout_s)
            self.dtype = getattr(torch, cfg.model.resolved_dtype(gpu=gpu))
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              trust_remote_code=cfg.model.trust_remote_code)
            self.model.to(device)

    # ------------------------------------------------------------------ learner
    def open_group(self, receivers: int, token: str) -> tuple[str, int]:
        """A new weight-sync group for `receivers` engines; returns its address."""
        from launch.planning.cluster import joins_cluster
        from launch.processes.roles import node_host
        from weightsync import WeightSender

        if self.sender is not None:
            self.sender.close()
        ws = self.cfg.weight_sync
        self.sender = WeightSender(receivers, host=node_host(joins_cluster(self.cfg)), port=0, token=token,
                                   bucket_mb=ws.bucket_mb, timeout_s=ws.deadline_s,
                                   connect_timeout_s=ws.connect_timeout_s, backend=ws.backend,
                                   tp=self.cfg.rollout.engine.tensor_parallel_size, mode="delta",
                                   full_every=2)  # pushes 1 and 3 of a group dense, 2 a delta
        return self.sender.address

    def connect(self) -> None:
        self.sender.connect()

    def push(self, version: int, change: float = 0.0, abort: bool = False) -> dict:
        """Push the model as `version`, first changing a `change` share of its elements; `abort`: a push the
        sender aborts after some buckets (raises its WeightSyncError)."""
        import torch

        from learner.gather import serving_weights

        if change:
            with torch.no_grad():
                for p in self.model.parameters():
                    mask = torch.rand(p.shape, device=p.device) < change
                    p.add_(mask * p.abs().clamp_min(1e-3))  # every picked element changes in any dtype
        payload = self.sender.prepare(serving_weights(self.model, self.dtype), version)
        if abort:
            unsendable(payload)
        stats = self.sender.send(payload)
        return {k: stats[k] for k in ("mode", "bytes", "seconds", "buckets", "acks", "changed_frac", "backend")}

    # ------------------------------------------------------------------ engine
    def start_engine(self) -> dict:
        """Start the engine as the run's actor 0 would (blocks until it is up); returns where it runs."""
        import os

        from actors.engine import EngineSpec
        from actors.host import EngineHost
        from launch.planning.cluster import joins_cluster
        from launch.processes.roles import node_host, where

        if joins_cluster(self.cfg):  # as launch.processes.actor_role: the engine's processes talk over this node's address
            os.environ.setdefault("VLLM_HOST_IP", node_host(cluster=True))
        spec = EngineSpec.from_config(self.cfg, self.model_dir, 0)
        self.host = EngineHost(spec, name="doctor-engine")
        self.host.start()

        async def label_zero():
            await self.host.engine.update_weight_version("0")

        self.host.call(label_zero())
        return {**where(), "address": node_host(joins_cluster(self.cfg))}

    def join(self, host: str, port: int, token: str) -> int:
        """Join the learner's group (a rejoin after a failed push keeps the engine's 'no version') and
        apply its pushes from now on."""
        from weightsync.receiver import WeightReceiver

        async def go():
            if self._follow is not None:
                self._follow.cancel()
            label = await self.host.engine.get_weight_version()
            serving = int(label) if str(label).lstrip("-").isdigit() else None
            self.receiver = WeightReceiver(self.host.engine, host, port, token=token, name="doctor-engine",
                                           initial_version=serving,
                                           clear_cache=self.cfg.weight_sync.resolved_clear_cache(
                                               gpu=not self.host.spec.cpu))
            rank = await self.receiver.init()
            self._follow = asyncio.create_task(self.receiver.run())
            return rank

        return self.host.call(go(), timeout_s=self.cfg.weight_sync.connect_timeout_s + 30)

    def serving(self) -> dict:
        """The engine's weight-version label, the receiver's version, and the labels of one generated token."""
        return {**self.host.served_labels(), "version": self.receiver.version if self.receiver else None}

    def close(self) -> None:
        import torch.distributed as dist

        if self.sender is not None:
            self.sender.close()
        if self.role == "learner" and dist.is_initialized():  # (an engine's process group is vLLM's)
            dist.destroy_process_group()
        if self.host is not None:
            if self._follow is not None:
                self.host.call(_cancel(self._follow), timeout_s=10)
            self.host.close()


async def _cancel(task) -> None:
    task.cancel()


def unsendable(payload) -> None:
    """Put a tensor the sender cannot send half-way into a dense `payload`: it has the wire dtype and a shape
    (so the push is announced and every engine starts receiving it) but no data (the meta device), so the
    data plane's first read of it raises — gloo's packer and NCCL's producer alike — and the sender aborts
    the push there (`WeightSender.send`: the abort key, then the plane's abort). A tensor of another dtype
    would not do: NCCL sends any dtype as bytes, and the push then failed in an engine's load instead (a
    receiver failure), held up by the push's deadline (~1.5 min at 7B width)."""
    import torch

    if payload.full is None:
        raise RuntimeError("the abort check needs a dense push")
    bad = torch.empty(2, dtype=payload.full[0][1].dtype, device="meta")
    payload.full.insert(max(1, len(payload.full) // 2), ("model.not_sendable", bad))


# ---------------------------------------------------------------------- the check, from the doctor's process
FIX_REACH = ("the learner node must reach this node's ports and the reverse: check the interfaces row "
             "(GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), firewalls, and the logs (the path printed above)")


def _fmt(stats: dict) -> str:
    rate = stats["bytes"] / max(stats["seconds"], 1e-9)
    return (f"{stats['mode']} push over {stats['backend']}: {stats['bytes'] / 1e6:,.2f} MB in {stats['seconds']:.2f} s "
            f"({rate / 1e6:,.1f} MB/s), {stats['buckets']} bucket(s)")


def _remote_error(e: BaseException) -> str:
    text = str(getattr(e, "cause", None) or e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:300]


class _Run:
    """The steps of the check against one learner peer and the engine peers, as rows."""

    def __init__(self, cfg: RunConfig, learner, engines: list, where: list[str], say):
        import ray

        self.ray, self.cfg, self.learner, self.engines, self.where, self.say = ray, cfg, learner, engines, where, say
        self.token = secrets.token_hex(16)
        self.wait_s = 3 * cfg.weight_sync.deadline_s + 60

    def rows(self, step: str, status: str, found: str, fix: str = "") -> list[Check]:
        return [Check(w, f"weights {step}", status, found, fix) for w in self.where]

    def group(self) -> float:
        """A new weight-sync group every engine joins; returns the rendezvous seconds."""
        t0 = time.monotonic()
        host, port = self.ray.get(self.learner.open_group.remote(len(self.engines), self.token), timeout=self.wait_s)
        joins = [e.join.remote(host, port, self.token) for e in self.engines]
        self.ray.get([self.learner.connect.remote(), *joins], timeout=self.cfg.weight_sync.connect_timeout_s + 60)
        return time.monotonic() - t0

    def push(self, version: int, **kw) -> dict:
        return self.ray.get(self.learner.push.remote(version, **kw), timeout=self.wait_s)

    def serving(self) -> list[dict]:
        return self.ray.get([e.serving.remote() for e in self.engines], timeout=120)

    def served(self, step: str, version: int, stats: dict, prefix: str = "") -> list[Check]:
        """Rows of a push every engine must now serve as `version` (label and a generated token)."""
        out = []
        for w, s in zip(self.where, self.serving()):
            ok = s["label"] == str(version) and s["token_labels"] == [str(version)]
            found = f"{prefix}{_fmt(stats)}; engine serves {s['label']!r}"
            out.append(Check(w, f"weights {step}", "PASS" if ok else "FAIL", found,
                             "" if ok else f"the engine should serve version {version} (tokens labelled "
                                           f"{s['token_labels']}); read its log (the path printed above)"))
        return out

    def steps(self) -> list[Check]:
        out: list[Check] = []
        try:
            rdv = self.group()
        except Exception as e:  # noqa: BLE001 - any failure is a row
            return self.rows("full", "FAIL", f"the weight-sync rendezvous failed: {_remote_error(e)}", FIX_REACH)
        self.say(f"[doctor] weight-sync group formed in {rdv:.1f} s; full push")
        try:
            out += self.served("full", 1, self.push(1), f"rendezvous {rdv:.1f} s; ")
        except Exception as e:  # noqa: BLE001
            return out + self.rows("full", "FAIL", f"the full push failed: {_remote_error(e)}", FIX_REACH)
        try:
            stats = self.push(2, change=0.01)
            out += self.served("delta", 2, stats, f"{stats['changed_frac']:.1%} of the elements changed; ")
            if stats["mode"] != "delta":
                out = out[:-len(self.where)] + self.rows("delta", "FAIL", f"a 1 % change went as a {stats['mode']} "
                                                          "push", "weightsync.delta should send the patch")
        except Exception as e:  # noqa: BLE001
            out += self.rows("delta", "FAIL", f"the delta push failed: {_remote_error(e)}",
                             "set weight_sync.mode=full, and report this with the engine node's Ray log")
        out += self.aborted()
        try:
            rdv = self.group()
            out += self.served("rejoin", 4, self.push(4), f"new group in {rdv:.1f} s; ")
        except Exception as e:  # noqa: BLE001
            out += self.rows("rejoin", "FAIL", f"a new group after the failed push failed: {_remote_error(e)}",
                             "actor restarts will not recover: " + FIX_REACH)
        return out

    def aborted(self) -> list[Check]:
        from weightsync.receiver import NO_VERSION

        self.say("[doctor] aborted push")
        try:
            self.push(3, abort=True)
            return self.rows("abort", "FAIL", "the sender did not fail a push holding a tensor it cannot send",
                             "weightsync.sender must abort such a push")
        except Exception as e:  # noqa: BLE001 - expected: the sender's WeightSyncError
            if "WeightSyncError" not in repr(e):
                return self.rows("abort", "FAIL", f"the push failed otherwise: {_remote_error(e)}", FIX_REACH)
        deadline = time.monotonic() + self.cfg.weight_sync.deadline_s + 10
        while True:  # each engine gives the push up once it reads the sender's abort key
            states = self.serving()
            if all(s["version"] is None for s in states) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out = []
        for w, s in zip(self.where, states):
            ok = s["version"] is None and not str(s["label"]).lstrip("-").isdigit() and \
                all(not str(t).lstrip("-").isdigit() for t in s["token_labels"])
            found = (f"aborted mid-push; the engine serves label {s['label']!r}, generated tokens carry "
                     f"{s['token_labels']}")
            out.append(Check(w, "weights abort", "PASS" if ok else "FAIL",
                             found + ("" if ok else f" (expected {NO_VERSION!r}: no version)"),
                             "" if ok else "the engine serves a half-loaded model under a version: its rows would "
                                           "be trained; use a checkout whose weightsync.receiver labels it "
                                           f"{NO_VERSION!r} after a failed push (reviews/gpu_path.md B1)"))
        return out


def _peer_options(cfg: RunConfig, node: dict | None, log: Path) -> dict:
    """Ray options of a learner peer (node None: where the learner's resources are) or an engine peer pinned
    to `node`, its output to `log`. CPU shares are 0: the doctor must not wait for CPUs a running job holds."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from launch.processes.actor_role import actor_env
    from launch.processes.roles import LOG_FILE_ENV

    env = {LOG_FILE_ENV: str(log)}
    if node is None:
        opts = {"num_cpus": 0, "num_gpus": 1 if cfg.learner.gpus_per_rank else 0}
        custom = cfg.learner.custom_resources
    else:
        gpus = cfg.rollout.gpus_per_actor
        opts = {"num_cpus": 0, "num_gpus": float(gpus) if gpus not in ("auto", None) else 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)}
        env.update(actor_env(cfg))
        custom = cfg.rollout.custom_resources
    opts["runtime_env"] = {"env_vars": env}
    if custom:
        opts["resources"] = {k: min(v, 1e-3) for k, v in custom.items()}
    return opts


def weight_checks(cfg: RunConfig, say) -> list[Check]:
    """The weight path's rows (module docstring); Ray must be initialised (`launch.planning.cluster.init_ray`)."""
    import ray

    from launch.commands.train import run_dir_for
    from launch.doctor.checks import hosts_actors

    t0 = time.monotonic()
    nodes = [n for n in ray.nodes() if n.get("Alive") and hosts_actors(cfg, n.get("Resources", {}))]
    if not nodes:
        return [Check("run", "weights", "FAIL", "no live node can host an actor",
                      "start the actor nodes, or fix rollout.custom_resources / rollout.gpus_per_actor")]
    work = run_dir_for(cfg).absolute().parent / f".doctor-weights-{secrets.token_hex(4)}"
    peers, rows = [], []
    try:
        try:
            model = str(small_model(cfg, work / "model"))
        except Exception as e:  # noqa: BLE001
            return [Check("run", "weights", "FAIL", f"could not build a {SMALL_LAYERS}-layer model of the run's "
                          f"architecture: {str(e)[:300]}", "check --model: an HF directory transformers can load")]
        remote = ray.remote(max_concurrency=2)(WeightPeer)
        learner = remote.options(**_peer_options(cfg, None, work / "learner.log")).remote(cfg, model, "learner")
        engines = [remote.options(**_peer_options(cfg, n, work / f"engine-{i}.log")).remote(cfg, model, "engine")
                   for i, n in enumerate(nodes)]
        peers = [learner, *engines]
        say(f"[doctor] starting {len(engines)} engine(s) of the {SMALL_LAYERS}-layer model "
            f"({cfg.weight_sync.backend} weight sync)")
        try:
            where = [w["address"] for w in ray.get([e.start_engine.remote() for e in engines],
                                                     timeout=START_TIMEOUT_S)]
        except Exception as e:  # noqa: BLE001
            rows = [Check(n["NodeManagerAddress"], "weights", "FAIL", f"the engine did not start: {_remote_error(e)}",
                          "read its log (the path printed above); check the versions and kv cache rows")
                    for n in nodes]
            return rows
        rows = _Run(cfg, learner, engines, where, say).steps()
        say(f"[doctor] weight path checked in {time.monotonic() - t0:.0f} s")
        return rows
    finally:
        for p in peers:
            with contextlib.suppress(Exception):  # killed below either way
                ray.get(p.close.remote(), timeout=60)
            ray.kill(p)
        shutil.rmtree(work / "model", ignore_errors=True)
        if peers and any(r.status == "FAIL" for r in rows):
            say(f"[doctor] the weight check's logs (learner, engines; on shared storage): {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
