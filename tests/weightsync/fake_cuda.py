"""A fake of ``weightsync.staging.CudaOps`` for tests on machines without CUDA: every call is logged as
(call, stream in use, args...), streams and events are named placeholders, host buffers are plain
CPU tensors. With ``stage_cpu`` CPU tensors are staged as a GPU learner's device tensors would be, so
a test can follow the bytes through the staging memory."""

import contextlib

import torch


class Named:
    def __init__(self, name):
        self.name = name


class Event(Named):
    """A recorded event: the copies it follows were done on the CPU already."""

    def synchronize(self):
        pass


class FakeOps:
    def __init__(self, stage_cpu: bool = False):
        self.log, self.current = [], "default"
        self.stage_cpu = stage_cpu
        self._streams = {}

    def on_host(self, t):
        return t.device.type == "cpu" and not self.stage_cpu

    def host_buffer(self, nbytes):
        self.log.append(("host_buffer", nbytes))
        return torch.zeros(nbytes, dtype=torch.uint8)

    def side_stream(self, device, role):
        return self._streams.setdefault(role, Named(role))

    def current_stream(self, device):
        return Named("default")

    def wait_stream(self, stream, other):
        self.log.append(("wait_stream", stream.name, other.name))

    def wait_event(self, stream, event):
        self.log.append(("wait_event", stream.name, event.name))

    @contextlib.contextmanager
    def use(self, stream):
        before, self.current = self.current, stream.name
        try:
            yield
        finally:
            self.current = before

    def copy_to_host(self, t, out, stream):
        self.log.append(("copy_to_host", self.current, stream.name))
        if t.device.type != "meta":  # meta tensors have no bytes to copy
            out.copy_(t)

    def to_device(self, t, device):
        self.log.append(("to_device", self.current))
        return t.clone()

    def record_event(self, stream):
        self.log.append(("record_event", stream.name))
        return Event(f"event on {stream.name}")

    def synchronize(self, stream):
        self.log.append(("synchronize", stream.name))

    def allocations(self) -> list[int]:
        """Sizes of the host buffers allocated so far, in order."""
        return [c[1] for c in self.log if c[0] == "host_buffer"]
