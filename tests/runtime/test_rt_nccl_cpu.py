"""NCCL-scheduled plans on a machine without GPUs: the CPU communicator runs them."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import cgc
from cgc import InputNode, MultiOutputNode, ReduceOp, allreduce

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


@pytest.mark.parametrize("example", ["allreduce", "pipeline_nccl"])
def test_gpu_examples_run_on_cpu_communicator(ray_cluster, example, caplog):
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
    assert first == again
    assert any("CPU communicator" in r.getMessage() for r in caplog.records)
    if example == "allreduce":
        assert first == [9.0, 9.0]  # mean of x*1 and x*2 for x = [1, 2, 3], summed


def test_collective_error_reaches_every_member_and_graph_continues(ray_cluster):
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
