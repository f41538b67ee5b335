"""NCCL-scheduled plans on a machine without GPUs: the CPU communicator runs them.

Each test runs twice: on the CPU communicator (what ``communicator="cpu"`` binds), and in
the test mode ``CGC_TEST_DEVICE_PROTOCOL=1``, where the same bindings run the device
communicators' protocol over CPU tensors - so the executor's device paths (headers,
declared static edges, errors as values on tensor edges, native collectives) run in CI.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import cgc
from cgc import InputNode, MultiOutputNode, ReduceOp, allgather, allreduce, reducescatter
from cgc.runtime.comm.binding import DEVICE_PROTOCOL_ON_CPU_ENV

ROOT = Path(__file__).resolve().parents[2]


@cgc.actor
class Grad:
    def __init__(self, rank):
        self.rank = rank

    def grad(self, x):
        if x[0] < 0:
            raise ArithmeticError("bad gradient")
        return np.asarray(x, dtype=np.float32) * (self.rank + 1)

    def total(self, g):
        return float(g.sum())


@pytest.fixture(params=["cpu", "cpu_protocol"])
def transport(request, monkeypatch):
    """The transport the plan's communicators get: "cpu" or the device protocol on CPU."""
    if request.param == "cpu_protocol":
        monkeypatch.setenv(DEVICE_PROTOCOL_ON_CPU_ENV, "1")
    else:
        monkeypatch.delenv(DEVICE_PROTOCOL_ON_CPU_ENV, raising=False)
    return request.param


@cgc.actor(num_gpus=0.5)
class Stage:
    def make(self, x):
        if x == "raise":
            raise KeyError("no such batch")
        if x == "wrong":
            return torch.zeros(3, dtype=torch.float32)
        return torch.arange(4, dtype=torch.float32) * x

    def mixed(self, x):
        return {"t": torch.full((2, 2), float(x)), "n": x, "tag": f"b{x}", "ids": [x, x + 1]}

    def use(self, t):
        return float(t.sum())

    def keys(self, v):
        return (float(v["t"].sum()), v["n"], v["tag"], v["ids"])


@cgc.actor(num_gpus=0.5)
class Part:
    def __init__(self, rank):
        self.rank = rank

    def make(self, x):
        if x < 0:
            raise ArithmeticError("bad part")
        return torch.arange(4, dtype=torch.float32) * (self.rank + 1) + x

    def show(self, v):
        if isinstance(v, list):
            return [t.tolist() for t in v]
        return v.tolist()


@pytest.mark.parametrize("example", ["allreduce", "pipeline_nccl"])
def test_gpu_examples_run_on_cpu_communicator(ray_cluster, example, caplog, transport):
    if transport == "cpu_protocol" and torch.cuda.is_available():
        pytest.skip("the examples make CUDA tensors where CUDA exists; the device protocol's "
                    "CPU stand-in carries CPU tensors (tests/gpu runs the real device paths)")
    plan = cgc.compile_file(ROOT / "examples" / f"{example}.py")
    assert plan.proto.lowered.communicators  # the plan really has NCCL parts
    from cgc.plan_schema.values import decode_value

    args = [decode_value(v) for v in plan.proto.example_args]
    with caplog.at_level(logging.WARNING, logger="cgc.runtime"):
        with plan.start(get_timeout=60, communicator="cpu") as g:
            first = g.execute(*args)
            first = [r.get() for r in first] if isinstance(first, list) else first.get()
            again = g.execute(*args)
            again = [r.get() for r in again] if isinstance(again, list) else again.get()
        assert {b.transport for b in g.comm_bindings.values()} == {transport}
    assert first == again
    assert any("CPU communicator" in r.getMessage() for r in caplog.records)
    if example == "allreduce":
        assert first == [9.0, 9.0]  # mean of x*1 and x*2 for x = [1, 2, 3], summed


def test_collective_error_reaches_every_member_and_graph_continues(ray_cluster, transport):
    ws = [Grad.bind(r) for r in range(2)]
    with InputNode() as inp:
        grads = [w.grad.bind(inp) for w in ws]
        red = allreduce.bind(grads, op=ReduceOp.SUM)
        dag = MultiOutputNode([w.total.bind(g) for w, g in zip(ws, red, strict=True)])
    with cgc.compile(dag, name="t_coll").start(communicator="cpu", get_timeout=60) as g:
        assert [r.get() for r in g.execute([1.0, 2.0])] == [9.0, 9.0]
        for r in g.execute([-1.0]):
            with pytest.raises(ArithmeticError, match="bad gradient"):
                r.get()
        assert [r.get() for r in g.execute([2.0])] == [6.0, 6.0]


def test_tensor_edges_carry_errors_mixed_values_and_declared_shapes(ray_cluster, transport):
    a, b = Stage.bind(), Stage.bind()
    with InputNode() as inp:
        static = a.make.bind(inp[0]).with_tensor_transport(
            "nccl", _static_shape=True, shape=(4,), dtype="float32")
        mixed = a.mixed.bind(inp[1]).with_tensor_transport("nccl")
        dag = MultiOutputNode([b.use.bind(static), b.keys.bind(mixed)])
    plan = cgc.compile(dag, name="t_edges")
    ch = [c for c in plan.proto.lowered.channels if c.static_shape][0]
    assert list(ch.spec.shape) == [4] and ch.spec.dtype == "float32"
    with plan.start(communicator="cpu", get_timeout=60) as g:
        assert [r.get() for r in g.execute(2, 3)] == [12.0, (12.0, 3, "b3", [3, 4])]
        # An error is one execution's value (fail-fast: its sibling output raises it too).
        for r in g.execute("raise", 1):
            with pytest.raises(KeyError, match="no such batch"):
                r.get()
        if transport == "cpu_protocol":  # the CPU communicator does not check declarations
            for r in g.execute("wrong", 2):
                with pytest.raises(Exception, match="static edge"):
                    r.get()
        # Nothing shifted: the next execution gets its own values.
        assert [r.get() for r in g.execute(1, 5)] == [6.0, (20.0, 5, "b5", [5, 6])]


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG])
def test_collectives_give_the_same_results_on_every_transport(ray_cluster, transport, op):
    ps = [Part.bind(r) for r in range(2)]
    with InputNode() as inp:
        made = [p.make.bind(inp) for p in ps]
        gathered = allgather.bind(made)
        scattered = reducescatter.bind(made, op=op)
        reduced = allreduce.bind(made, op=op)
        dag = MultiOutputNode([p.show.bind(v) for p, v in zip(ps, gathered, strict=True)]
                              + [p.show.bind(v) for p, v in zip(ps, scattered, strict=True)]
                              + [p.show.bind(v) for p, v in zip(ps, reduced, strict=True)])
    x = 1.0
    parts = [torch.arange(4, dtype=torch.float32) * (r + 1) + x for r in range(2)]
    full = {ReduceOp.SUM: parts[0] + parts[1], ReduceOp.MAX: torch.maximum(*parts),
            ReduceOp.AVG: (parts[0] + parts[1]) / 2}[op].tolist()
    with cgc.compile(dag, name=f"t_coll_{op.name.lower()}").start(
            communicator="cpu", get_timeout=60) as g:
        out = [r.get() for r in g.execute(x)]
        assert out[:2] == [[t.tolist() for t in parts]] * 2
        assert out[2:4] == [full[:2], full[2:]]
        assert out[4:] == [full, full]
        for r in g.execute(-1.0):
            with pytest.raises(ArithmeticError, match="bad part"):
                r.get()
        assert [r.get() for r in g.execute(x)] == out


@cgc.actor(num_gpus=1)
class Uneven:
    def __init__(self, k):
        self.k = k

    def f(self, n):
        return torch.arange(float(n)) + self.k


def test_an_uneven_reducescatter_is_an_error_naming_the_collective(ray_cluster, transport):
    """Issue 23's repro: dim 0 of 3 over two members. Each member's result is a clear error
    naming the collective node (it was [10.], [12.]: the third sum dropped without a word);
    an even execution after it is exact."""
    a, b = Uneven.bind(0), Uneven.bind(10)
    with InputNode() as inp:
        dag = MultiOutputNode(reducescatter.bind([a.f.bind(inp), b.f.bind(inp)]))
    with cgc.compile(dag, name="t_uneven").start(communicator="cpu", get_timeout=60) as g:
        for r in g.execute(3):
            with pytest.raises(ValueError, match=r"reducescatter: dim 0 \(3\) is not divisible "
                                                 r"by the world size 2") as info:
                r.get()
            assert "reducescatter" in str(info.value).split("dim 0")[0]  # names the node
        assert [r.get().tolist() for r in g.execute(4)] == [[10.0, 12.0], [14.0, 16.0]]
