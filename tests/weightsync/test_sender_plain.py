"""WeightSender against real plain-gloo receiver processes (no vLLM, so these run in seconds):
values arrive intact and acknowledged (also when sent from a background thread), and a receiver that dies or freezes mid-push makes the sender
raise within its deadline, naming that receiver."""

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.weightsync.fake_cuda import FakeOps
from tests.weightsync.plain_procs import start_plain_receivers, stop
from weightsync import WeightSender, WeightSyncError
from weightsync import sender as sender_mod
from weightsync.staging import StagingArea

TIMEOUT_S = 4.0
TOKEN = "a1" * 32  # the run's weight-sync token (RunSecrets.weight_sync_token: 64 hex digits)
MARGIN_S = 3.0  # heartbeat diagnosis (1 s) + scheduling noise on a loaded 2-core box


def _weights(seed: int, n: int = 24) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = [(f"model.layers.{i}.mlp.up_proj.weight", torch.randn(256, 256, generator=g)) for i in range(n)]
    out.append(("model.norm.weight", torch.randn(256, generator=g).to(torch.bfloat16)))
    return out


@pytest.fixture
def procs():
    started: list = []
    yield started
    stop(started)


def _connect(sender: WeightSender, procs: list, names: list[str], **kw) -> None:
    procs += start_plain_receivers(sender.address, names, token=TOKEN, **kw)
    sender.connect()


def test_push_reaches_every_receiver_and_is_acknowledged(procs):
    sender = WeightSender(2, bucket_mb=0.5, timeout_s=30, connect_timeout_s=120, token=TOKEN)
    _connect(sender, procs, ["rx-a", "rx-b"], pushes=2, checksum=True)
    with ThreadPoolExecutor(1) as background:  # the learner's pattern: send in the background, prepare the next
        first = background.submit(sender.send, sender.prepare(iter(_weights(3)), version=3))
        second = sender.prepare(iter(_weights(4)), version=4)
        sent = [first.result(), background.submit(sender.send, second).result()]
    for version, stats in zip((3, 4), sent):
        named = _weights(version)
        expected = sum(float(t.double().sum()) for _, t in named)
        assert stats["acks"] == {"rx-a": str(version), "rx-b": str(version)}
        assert stats["bytes"] == sum(t.numel() * t.element_size() for _, t in named)
        assert (stats["mode"], stats["changed_frac"], stats["backend"]) == ("full", 1.0, "gloo")
        assert stats["buckets"] > 2  # 0.5 MB cap over ~6 MB
        for name in ("rx-a", "rx-b"):
            assert stats["ack_info"][name]["checksum"] == pytest.approx(expected, rel=1e-9)
    assert sender.versions == {"rx-a": 4, "rx-b": 4}
    for p in procs:
        assert p.wait(timeout=30) == 0, p.stderr.read().decode()[-2000:]


def test_pushes_reuse_their_staging_memory(procs, monkeypatch):
    """A GPU learner's pushes are staged in host memory that the first push allocates (one buffer per
    tensor, of its size) and each later push overwrites once the one before it was sent; every push
    still arrives intact. (CPU tensors staged as device ones would be: ``FakeOps``.)"""
    ops = FakeOps(stage_cpu=True)
    monkeypatch.setattr(sender_mod, "StagingArea", lambda: StagingArea(ops))
    sender = WeightSender(1, bucket_mb=0.5, timeout_s=30, connect_timeout_s=120, token=TOKEN)
    _connect(sender, procs, ["rx"], pushes=3, checksum=True)
    for version in (5, 6, 7):
        stats = sender.send(sender.prepare(iter(_weights(version)), version=version))
        expected = sum(float(t.double().sum()) for _, t in _weights(version))
        assert stats["ack_info"]["rx"]["checksum"] == pytest.approx(expected, rel=1e-9)
    sender.close()
    # 24 fp32 256 x 256 matrices (262144 bytes each) and a bf16 vector of 256 (512 bytes), once
    assert ops.allocations() == [262144] * 24 + [512]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_receiver_lost_mid_push_fails_within_deadline(procs, sig):
    sender = WeightSender(2, bucket_mb=0.25, timeout_s=TIMEOUT_S, connect_timeout_s=120, token=TOKEN)
    _connect(sender, procs, ["rx-ok", "rx-victim"])
    victim = next(r for r, info in sender.receivers.items() if info["name"] == "rx-victim")
    pid = sender.receivers[victim]["worker"]["pid"]
    hit = {}

    def named():
        for i, item in enumerate(_weights(0)):
            if i == 6:
                os.kill(pid, sig)
                hit["t"] = time.monotonic()
            yield item

    with pytest.raises(WeightSyncError) as err:
        sender.push(named(), version=1)
    elapsed = time.monotonic() - hit["t"]
    print(f"push failed {elapsed:.2f} s after {sig.name}: {err.value}")
    assert elapsed < TIMEOUT_S + MARGIN_S
    assert f"rank {victim}" in str(err.value) and "rx-victim" in str(err.value)
    assert "no heartbeat" in err.value.failed_ranks[victim]
    assert "no heartbeat" in err.value.suspects["rx-victim"]  # by name: what the driver restarts
    with pytest.raises(WeightSyncError, match="unusable"):
        sender.push(_weights(1), version=2)


def test_a_receiver_that_freezes_after_loading_fails_the_push_by_its_heartbeat(procs):
    """Every byte arrived, then the receiver froze before acknowledging: its heartbeat stops, and the
    push fails naming it (the driver restarts that actor) instead of waiting out the ack deadline."""
    sender = WeightSender(1, bucket_mb=0.25, timeout_s=600, connect_timeout_s=120, token=TOKEN)
    _connect(sender, procs, ["rx-frozen"], freeze_before_ack=True)
    with pytest.raises(WeightSyncError) as err:
        sender.push(_weights(0), version=1)
    assert "no heartbeat for 10 s while loading" in err.value.failed_ranks[1], err.value.failed_ranks
    assert "rx-frozen" in err.value.suspects


def test_missing_receiver_is_a_clear_error(procs):
    sender = WeightSender(2, timeout_s=TIMEOUT_S, connect_timeout_s=3, token=TOKEN)
    procs += start_plain_receivers(sender.address, ["only-one"], token=TOKEN)
    deadline = time.monotonic() + 120
    while sender.registered() != [1]:
        assert time.monotonic() < deadline, "the one receiver never registered"
        time.sleep(0.05)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"only 1 of 2 receivers.*missing ranks \[2\]"):
        sender.connect()
    assert time.monotonic() - t0 < 3 + MARGIN_S
