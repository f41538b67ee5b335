"""Device hints on host edges: readers get tensors on the device the plan names."""

from __future__ import annotations

import torch

import cgc
from cgc import InputNode
from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.devices import DeviceMoveError, DeviceReader, move_to, plan_gives_gpu, with_device


class _FakeReader:
    def __init__(self, value):
        self.value = value
        self.closed = False

    def read(self, timeout=None):
        return self.value

    def close(self):
        self.closed = True


def test_move_to_walks_containers_and_keeps_the_rest():
    t = torch.arange(3)
    moved = move_to({"a": [t, (t, 1)], "b": "x"}, "cpu")
    assert torch.equal(moved["a"][0], t) and moved["a"][1][1] == 1 and moved["b"] == "x"


def test_with_device_wraps_only_when_asked():
    plain = _FakeReader(1)
    assert with_device(plain, pb.Channel(device=pb.DEVICE_DEFAULT)) is plain
    wrapped = with_device(plain, pb.Channel(device=pb.CPU))
    assert isinstance(wrapped, DeviceReader) and wrapped.read() == 1
    wrapped.close()  # passes through to the channel
    assert plain.closed
    if not torch.cuda.is_available():  # CPU-only runs of GPU plans keep tensors on the CPU
        assert with_device(plain, pb.Channel(device=pb.GPU)) is plain


def test_a_reader_the_plan_gives_no_gpu_moves_anyway_and_the_failure_is_typed():
    """A reader without a GPU (only Ray programs through cgc.ray_compat compile one) moves
    to "cuda" as Ray's does; where torch cannot, the read raises DeviceMoveError with
    torch's error as its cause (the actor loop turns it into the task's error)."""
    assert plan_gives_gpu(pb.Actor(options=pb.ActorOptions(num_gpus=1)))
    live = pb.Actor(external=pb.ExternalActor(actor_id="ab"))
    live.external.placement.observed = True
    assert not plan_gives_gpu(live) and not plan_gives_gpu(pb.Actor())
    plain = _FakeReader(torch.ones(2))
    wrapped = with_device(plain, pb.Channel(device=pb.GPU), reader_has_gpu=False)
    assert isinstance(wrapped, DeviceReader)
    if not torch.cuda.is_available():
        try:
            wrapped.read()
        except DeviceMoveError as exc:
            assert exc.__cause__ is not None and "cuda" in str(exc)
        else:
            raise AssertionError("a move to cuda without CUDA succeeded")


@cgc.actor
class Maker:
    def make(self, n):
        return {"t": torch.ones(n)}

    def total(self, d):
        return float(d["t"].sum())


def test_cpu_device_hint_runs_end_to_end(ray_cluster):
    a, b = Maker.bind(), Maker.bind()
    with InputNode() as inp:
        dag = b.total.bind(a.make.bind(inp).with_tensor_transport(device="cpu"))
    plan = cgc.compile(dag)
    assert any(c.device == pb.CPU for c in plan.proto.lowered.channels)
    with plan.start() as graph:
        assert graph.execute(4).get(timeout=30) == 4.0
