"""Actor classes and small graphs for the runtime tests, built through the real pipeline.

Everything goes through ``cgc.compile`` (frontend → passes → verify → ``cgc.runtime.Plan``),
so these tests exercise the same plans users get.
"""

from __future__ import annotations

import os
import time

import cgc
from cgc import InputNode, MultiOutputNode


class AppError(ValueError):
    """A user exception type the tests catch by its own class."""


@cgc.actor
class Echo:
    def echo(self, x):
        return x


@cgc.actor
class Worker:
    def __init__(self, k=1):
        self.k = k
        self.calls = 0

    def add(self, x):
        self.calls += 1
        return x + self.k

    def check(self, x):
        if x < 0:
            raise AppError(f"negative input {x}")
        return x

    def slow(self, x):
        time.sleep(x)
        return x

    def pid(self, x=None):
        return os.getpid()

    def busy(self, seconds):
        """Burn CPU for ``seconds`` (a control for the idle-CPU checks)."""
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return seconds

    def unsendable(self, x):
        if x:
            return lambda: x  # a lambda cannot be pickled by the channel
        return x

    def combine(self, *xs):
        return sum(xs)

    @cgc.method(num_returns=2)
    def split(self, x):
        return x, x * 2


def echo_plan():
    e = Echo.bind()
    with InputNode() as inp:
        dag = e.echo.bind(inp)
    return cgc.compile(dag, name="t_echo")


def chain_plan(n=3):
    ws = [Worker.bind(i + 1) for i in range(n)]
    with InputNode() as inp:
        x = inp
        for w in ws:
            x = w.add.bind(x)
    return cgc.compile(x, name="t_chain")


def check_chain_plan():
    """check (raises on x < 0) on one actor, then add on another."""
    a, b = Worker.bind(0), Worker.bind(10)
    with InputNode() as inp:
        dag = b.add.bind(a.check.bind(inp))
    return cgc.compile(dag, name="t_check")


def fanout_plan(n=3):
    ws = [Worker.bind(i) for i in range(n)]
    c = Worker.bind(0)
    with InputNode() as inp:
        dag = c.combine.bind(*[w.add.bind(inp) for w in ws])
    return cgc.compile(dag, name="t_fanout")


def multi_plan():
    a, b = Worker.bind(0), Worker.bind(100)
    with InputNode() as inp:
        x, y = a.split.bind(inp)
        dag = MultiOutputNode([x, b.add.bind(y)])
    return cgc.compile(dag, name="t_multi")


def direct_return_plan():
    """a.echo (declared direct_return: one tensor) -> b.add(x, k=0) -> output, and a.echo's
    value straight to the driver too."""
    a, b = Echo.bind(), Worker.bind(0)
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport("shm", _direct_return=True)
        dag = MultiOutputNode([x, b.add.bind(x)])
    return cgc.compile(dag, name="t_direct")


def extract_plan():
    """worker takes the whole input (``pid(inp)``) and ``inp[0]``, ``inp[1]``
    (``combine``): its READ of the whole input's channel extracts both (``Op.extract``).

    The frontend refuses a graph that mixes ``inp`` and ``inp[i]`` (Ray's rule), so the
    graph is the traced ``combine(inp[0], inp[1])`` with a ``pid(inp)`` task added by hand,
    lowered by the compiler's passes (a plan another producer could write).
    """
    from cgc.passes import lower
    from cgc.plan_schema import plan_pb2 as pb
    from cgc.runtime import Plan

    a = Worker.bind(0)
    with InputNode() as inp:
        dag = a.combine.bind(inp[0], inp[1])
    traced = cgc.compile(dag, name="t_extract")
    proto = pb.Plan()
    proto.CopyFrom(traced.proto)
    g = proto.graph
    out = g.nodes.pop()  # OUTPUT goes last again, after the new task
    pid = g.nodes.add(id=out.id, kind=pb.CALL, name="worker.pid#1", actor="worker",
                      method="pid", num_returns=1, bind_index=1)
    pid.args.add().ref.node = 0
    out.id += 1
    out.args.add().ref.node = pid.id
    out.multi_output = True
    g.nodes.append(out)
    g.whole_input = True
    proto.ClearField("lowered")
    proto.ClearField("config")
    return Plan(lower(proto), classes=traced.classes)


def slow_plan():
    w = Worker.bind()
    with InputNode() as inp:
        dag = w.slow.bind(inp)
    return cgc.compile(dag, name="t_slow")


def two_actor_plan(handles=None):
    """b.combine(a.slow(x), x); with ``handles`` (two live actors) the plan binds them."""
    a, b = handles if handles is not None else (Worker.bind(), Worker.bind())
    with InputNode() as inp:
        dag = b.combine.bind(a.slow.bind(inp), inp)
    return cgc.compile(dag, name="t_pair")


def slow_chain_plan():
    """a.slow(x) -> b.add: an execution stays pending while a sleeps."""
    a, b = Worker.bind(), Worker.bind(1)
    with InputNode() as inp:
        dag = b.add.bind(a.slow.bind(inp))
    return cgc.compile(dag, name="t_slow_chain")


def unsendable_plan():
    a, b = Worker.bind(), Worker.bind(1)
    with InputNode() as inp:
        dag = b.add.bind(a.unsendable.bind(inp))
    return cgc.compile(dag, name="t_unsendable")


def error_and_slow_plan(slow_first=False):
    """MultiOutputNode([a.check(x), b.slow(y)]): output 0 fails at once for x < 0 while
    output 1 is still running (``slow_first``: the same with the outputs swapped)."""
    a, b = Worker.bind(0), Worker.bind(0)
    with InputNode() as inp:
        outs = [a.check.bind(inp[0]), b.slow.bind(inp[1])]
        dag = MultiOutputNode(outs[::-1] if slow_first else outs)
    return cgc.compile(dag, name="t_err_slow")
