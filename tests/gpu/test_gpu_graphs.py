"""Whole graphs on one GPU: transports bound at start, CUDA tensors between actors.

Two actors with ``num_gpus=0.5`` share the GPU: ``communicator="auto"`` binds their
communicator to CUDA IPC; with the test-only fake-hosts mode (``CGC_NCCL_FAKE_HOSTS=1``)
the same plan runs over real NCCL with two ranks on the one device. On a machine with two
GPUs the same tests run once more with one whole GPU per actor (``nccl_2gpu``): NCCL
between distinct GPUs over its own transport. Each test checks the values, errors as
values on tensor edges, and that nothing shifts afterwards.
"""

from __future__ import annotations

import time

import pytest
import torch

import cgc
from cgc import InputNode, MultiOutputNode, ReduceOp, allreduce
from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.errors import GetTimeoutError

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(params=["cuda_ipc", "nccl", "nccl_2gpu"])
def transport(request, monkeypatch):
    """The placement and binding under test: CUDA IPC and fake-hosts NCCL on one GPU (as in
    conftest), or ``nccl_2gpu``: each actor on a GPU of its own, real NCCL (2 GPUs)."""
    from cgc.runtime.comm.binding import FAKE_HOSTS_ENV

    if request.param == "nccl_2gpu" and GPUS < 2:
        pytest.skip(f"needs 2 GPUs (this machine has {GPUS})")
    if request.param == "nccl":
        monkeypatch.setenv(FAKE_HOSTS_ENV, "1")
    else:
        monkeypatch.delenv(FAKE_HOSTS_ENV, raising=False)
    return request.param


def _placed(cls, transport):
    """``cls`` as the placement under test asks: one whole GPU per actor for ``nccl_2gpu``."""
    return cls.options(num_gpus=1) if transport == "nccl_2gpu" else cls


def _bound(transport):
    """The binding the communicators must get."""
    return "nccl" if transport == "nccl_2gpu" else transport


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Producer:
    def make(self, x):
        if x == "raise":
            raise KeyError("no such batch")
        if x == "slow":
            time.sleep(30)
        return torch.arange(1024, dtype=torch.float32, device="cuda") * float(x)

    def mixed(self, x):
        return {"t": torch.full((4, 4), float(x), device="cuda"), "n": x, "cpu": torch.ones(2)}


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Consumer:
    def use(self, t):
        assert t.is_cuda, t.device
        return float(t.sum().item())

    def keys(self, v):
        assert v["t"].is_cuda and not v["cpu"].is_cuda
        return (float(v["t"].sum().item()), v["n"], float(v["cpu"].sum()))


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Worker:
    def __init__(self, rank):
        self.rank = rank

    def grad(self, x):
        if x < 0:
            raise ArithmeticError("bad gradient")
        return torch.full((256,), float(x) * (self.rank + 1), device="cuda")

    def total(self, g):
        assert g.is_cuda
        return float(g.sum().item())


def _p2p_dag(static: bool, transport: str):
    a, b = _placed(Producer, transport).bind(), _placed(Consumer, transport).bind()
    with InputNode() as inp:
        t = a.make.bind(inp[0])
        t = (t.with_tensor_transport("nccl", _static_shape=True, shape=(1024,),
                                     dtype="float32") if static
             else t.with_tensor_transport("nccl"))
        m = a.mixed.bind(inp[1]).with_tensor_transport("nccl")
        return MultiOutputNode([b.use.bind(t), b.keys.bind(m)])


@pytest.mark.parametrize("static", [False, True])
def test_tensor_edges_values_errors_and_binding(ray_cluster, transport, static):
    plan = cgc.compile(_p2p_dag(static, transport), name=f"gpu_p2p_{transport}_{int(static)}")
    tri = 1023 * 1024 / 2
    with plan.start(get_timeout=120) as g:
        assert {b.transport for b in g.comm_bindings.values()} == {_bound(transport)}
        assert set(g.channel_bindings[c.id] for c in plan.proto.lowered.channels
                   if c.kind == pb.CHAN_NCCL) == {_bound(transport)}
        for x in (1, 2, 3):
            assert [r.get() for r in g.execute(x, x)] == [tri * x, (16.0 * x, x, 2.0)]
        for r in g.execute("raise", 1):
            with pytest.raises(KeyError, match="no such batch"):
                r.get()
        assert [r.get() for r in g.execute(5, 6)] == [tri * 5, (96.0, 6, 2.0)]


def test_native_allreduce_between_gpu_actors(ray_cluster, transport):
    ws = [_placed(Worker, transport).bind(r) for r in range(2)]
    with InputNode() as inp:
        grads = [w.grad.bind(inp) for w in ws]
        red = allreduce.bind(grads, op=ReduceOp.AVG)
        dag = MultiOutputNode([w.total.bind(g) for w, g in zip(ws, red, strict=True)])
    with cgc.compile(dag, name=f"gpu_allreduce_{transport}").start(get_timeout=120) as g:
        assert {b.transport for b in g.comm_bindings.values()} == {_bound(transport)}
        assert [r.get() for r in g.execute(2.0)] == [256 * 3.0] * 2  # mean of 2 and 4
        for r in g.execute(-1.0):
            with pytest.raises(ArithmeticError, match="bad gradient"):
                r.get()
        assert [r.get() for r in g.execute(1.0)] == [256 * 1.5] * 2


def test_hung_device_receive_is_aborted_at_teardown(ray_cluster, transport):
    """A consumer blocked in a posted receive (static edge) while its producer sleeps: the
    get times out with a report naming where each actor waits, and teardown (which aborts
    the communicators) leaves the GPU usable for the next graph."""
    plan = cgc.compile(_p2p_dag(True, transport), name=f"gpu_hang_{transport}")
    g = plan.start(get_timeout=3, teardown_timeout=20)
    try:
        assert [r.get() for r in g.execute(1, 1)][1] == (16.0, 1, 2.0)
        refs = g.execute("slow", 1)
        with pytest.raises(GetTimeoutError) as info:
            refs[0].get()
        assert any(row["actor"] == "consumer" for row in info.value.blocked)
    finally:
        g.teardown()
    # The GPU and its actors are free again: the same plan starts and runs.
    with plan.start(get_timeout=120) as g2:
        assert [r.get() for r in g2.execute(1, 1)][1] == (16.0, 1, 2.0)
