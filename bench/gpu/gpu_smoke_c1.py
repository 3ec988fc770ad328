"""Step overlap_c1 of bench/gpu/gpu_smoke.py (reviews/gpu_path_2.md, Appendix A; torch only): a delta push whose
broadcasts block their stream does not hold up the training stream (C1).

Why: learner rank 0 trains the next step on the default stream while the previous version travels. A
broadcast waits for every engine; a late one stalls its stream. `weightsync.nccl.plane.broadcast_patches`
queues the copies and broadcasts on a "send" stream ordered after the staging event, so the default
stream never waits for them. The CPU tests check the order of calls with fake CUDA ops; this checks it
on the device.

How: patches staged as `WeightSender.prepare` stages them (`weightsync.staging`), sent by
`broadcast_patches` on a thread (as the sender's transmit thread does) through a stand-in communicator
whose every broadcast spins its stream for `--sleep-s` seconds (`torch.cuda._sleep`, the spin calibrated
here: its clock needs pynvml otherwise). Once the first broadcast is queued, the main thread times
`--matmuls` matmuls on the default stream. They must take about as long as alone, not the push's
broadcasts × sleep, and every broadcast must have been given the send stream (neither None nor the
default stream). `--device cpu` runs the same calls on CPU tensors (no streams: only the code path).

    python bench/gpu/gpu_smoke_c1.py [--sleep-s 0.5 --matmuls 30 --matrix 8192]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from weightsync.nccl.plane import broadcast_patches  # noqa: E402
from weightsync.packing import Patch  # noqa: E402
from weightsync.staging import StagingArea  # noqa: E402


class SleepComm:
    """Stands in for vLLM's PyNcclCommunicator: each broadcast blocks its stream (CUDA) or this thread (CPU)
    for `seconds`, as a broadcast waiting for a late engine would; records the stream it was given."""

    def __init__(self, device: torch.device, seconds: float, cycles_per_s: float):
        self.device, self.seconds, self.cycles_per_s = device, seconds, cycles_per_s
        self.streams: list = []
        self.first = threading.Event()

    def broadcast(self, tensor, src, stream=None):
        self.streams.append(None if stream is None else stream.cuda_stream)
        if self.device.type == "cuda":
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(self.seconds * self.cycles_per_s))
        else:
            time.sleep(self.seconds)
        self.first.set()


def spin_rate(device: torch.device) -> float:
    """`torch.cuda._sleep` cycles per second on this device (0 on CPU)."""
    if device.type != "cuda":
        return 0.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10**6)  # warm-up
    start.record()
    torch.cuda._sleep(10**8)
    end.record()
    end.synchronize()
    return 10**8 / (start.elapsed_time(end) / 1e3)


def staged_patches(device: torch.device, n: int, size: int, area: StagingArea):
    """`n` patches of every 7th element of a `size`² bf16 weight, staged in `area` as a delta push's are;
    and the staging event."""
    w = torch.randn(size, size, device=device).to(torch.bfloat16)
    idx = torch.arange(0, w.numel(), 7, device=device, dtype=torch.int32)
    stager = area.stager(1)
    stager.expect_delta(n * w.numel() * w.element_size(), n)
    patches = [Patch(f"w{i}", stager.patch(idx), stager.patch(w.view(-1)[idx.long()]), tuple(w.shape))
               for i in range(n)]
    return patches, stager.done()


def timed_matmuls(a: torch.Tensor, n: int) -> float:
    """Seconds `n` matmuls of `a` take on the current (default) stream."""
    if a.device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(n):
            a @ a
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        a @ a
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sleep-s", type=float, default=0.5, help="how long each broadcast blocks its stream")
    ap.add_argument("--patches", type=int, default=4, help="patches (2 broadcasts each: indices, values)")
    ap.add_argument("--weight", type=int, default=4096, help="side of each patched bf16 weight")
    ap.add_argument("--matrix", type=int, default=8192, help="side of the bf16 matrix the training stream multiplies")
    ap.add_argument("--matmuls", type=int, default=30)
    ap.add_argument("--slack-s", type=float, default=1.0, help="how much longer the matmuls may take during the push")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke_c1: no CUDA device (use --device cpu to run the code path only)", file=sys.stderr)
        return 2
    comm = SleepComm(device, args.sleep_s, spin_rate(device))
    patches, ready = staged_patches(device, args.patches, args.weight, StagingArea())
    a = torch.randn(args.matrix, args.matrix, device=device).to(torch.bfloat16)
    timed_matmuls(a, 2)  # warm-up
    alone = timed_matmuls(a, args.matmuls)
    t0 = time.perf_counter()
    push = threading.Thread(target=broadcast_patches, args=(comm, patches, ready), name="transmit")
    push.start()
    comm.first.wait(30)
    during = timed_matmuls(a, args.matmuls)
    push.join()
    push_s = time.perf_counter() - t0
    blocked = 2 * args.patches * args.sleep_s
    cuda = device.type == "cuda"
    default = torch.cuda.default_stream(device).cuda_stream if cuda else None
    out = {"device": str(device), "matmuls_alone_s": round(alone, 4), "matmuls_during_push_s": round(during, 4),
           "push_s": round(push_s, 3), "broadcasts": len(comm.streams), "blocked_s": blocked,
           "send_streams": sorted({str(s) for s in comm.streams}), "default_stream": str(default)}
    problems = []
    if len(comm.streams) != 2 * args.patches:
        problems.append(f"{len(comm.streams)} broadcasts, expected {2 * args.patches}")
    if cuda and (None in comm.streams or default in comm.streams):
        problems.append(f"broadcasts queued on {out['send_streams']}, the default stream is {default} (C1 regressed)")
    if during > alone + args.slack_s:
        problems.append(f"matmuls took {during:.2f} s during the push against {alone:.2f} s alone: the default stream "
                        f"waited for the push's broadcasts (C1 regressed)")
    if push_s < 0.8 * blocked:
        problems.append(f"the push took {push_s:.2f} s, less than its {blocked:.1f} s of blocked broadcasts: the "
                        "stand-in did not block, the check proves nothing")
    out["summary"] = (f"matmuls {alone:.3f} s alone, {during:.3f} s during a push blocked {blocked:.1f} s "
                      f"({push_s:.1f} s); {len(comm.streams)} broadcasts "
                      + ("on the send stream" if cuda else "(CPU: no streams, the code path only)")
                      + (f" — FAILED: {'; '.join(problems)}" if problems else ""))
    print("SMOKE " + json.dumps(out), flush=True)
    if problems:
        print("gpu_smoke_c1: " + "; ".join(problems), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
