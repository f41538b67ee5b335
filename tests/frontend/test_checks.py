"""Every bad input raises CompileError naming the node, Class.method and file:line."""

from __future__ import annotations

import sys

import frontend_models as m
import pytest

import cgc
from cgc.errors import CompileError
from cgc.frontend import InputNode, MultiOutputNode, allreduce, trace
from cgc.plan_schema.errors import EXIT_INVALID_INPUT, CgcError

Worker = cgc.actor(m.Worker)
FILE = "test_checks.py"


def _next_line() -> int:
    """The line after the caller's: where the offending bind is written."""
    return sys._getframe(1).f_lineno + 1


def _raises(dag, *parts: str, **kw) -> CompileError:
    with pytest.raises(CompileError) as info:
        trace(dag, **kw)
    msg = str(info.value)
    for p in parts:
        assert p in msg, f"{p!r} not in {msg!r}"
    assert isinstance(info.value, CgcError) and info.value.exit_code == EXIT_INVALID_INPUT
    return info.value


def test_wrong_arity():
    w = Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        dag = w.fwd.bind(inp, 2.0, 3)
    err = _raises(
        dag,
        "worker.fwd#0 (Worker.fwd)",
        f"{FILE}:{line}",
        "fwd() takes 2 positional arguments but 3 positional were bound",
        "def fwd(x, scale=1.0)",
    )
    assert (err.node, err.actor, err.method) == ("worker.fwd#0", "worker", "fwd")
    assert err.loc.endswith(f"{FILE}:{line}")


def test_unknown_keyword_and_missing_argument():
    w = Worker.bind()
    with InputNode() as inp:
        x = w.fwd.bind(inp, scalee=2)
    _raises(x, "worker.fwd#0 (Worker.fwd)", "scalee")
    w2 = Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        y = w2.add.bind(inp)
    _raises(y, "worker.add#0 (Worker.add)", f"{FILE}:{line}", "missing a required argument")


def test_unknown_method_suggests_a_name():
    w = Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        dag = w.fwdd.bind(inp)
    _raises(dag, "worker.fwdd#0 (Worker.fwdd)", f"{FILE}:{line}", "did you mean 'fwd'")


def test_ctor_arguments_must_fit_init():
    line = _next_line()
    w = Worker.bind(1, 2, 3)
    with InputNode() as inp:
        dag = w.fwd.bind(inp)
    _raises(dag, "actor worker (Worker.__init__)", f"{FILE}:{line}", "__init__() takes")


def test_dangling_node():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        x = w0.fwd.bind(inp)
        line = _next_line()
        w1.log.bind(x)
        dag = w1.fwd.bind(x)
    _raises(
        dag, "worker1.log#0 (Worker.log)", f"{FILE}:{line}", "reaches no output", "MultiOutputNode"
    )


def test_dangling_call_with_constant_args_on_a_graph_actor():
    w = Worker.bind()
    with InputNode() as inp:
        dag = w.fwd.bind(inp)
        line = _next_line()
        w.log.bind(1)
    _raises(dag, "worker.log#", "(Worker.log)", f"{FILE}:{line}", "reaches no output")


def test_unused_input_attribute():
    w = Worker.bind()
    with InputNode() as inp:
        dag = w.fwd.bind(inp[0])
        line = _next_line()
        _unused = inp.mask
    _raises(dag, "input.mask (graph input)", f"{FILE}:{line}", "reaches no output")


@pytest.mark.parametrize(
    "wrap",
    [
        lambda x: [x],
        lambda x: {"a": (1, [x])},
        lambda x: ({1, 2}, [[{"deep": x}]]),
    ],
)
def test_nodes_hidden_in_containers(wrap):
    w = Worker.bind()
    with InputNode() as inp:
        x = w.fwd.bind(inp)
        line = _next_line()
        dag = w.add.bind(wrap(x), 1)
    _raises(dag, "worker.add#1 (Worker.add)", f"{FILE}:{line}", "hidden inside", "worker.fwd#0")


def test_cycle():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        a = w0.fwd.bind(inp)
        b = w1.fwd.bind(a)
    a.args = (b,)  # not possible through bind(); a corrupted graph must still be caught
    _raises(b, "cycle", "worker0.fwd#0", "worker1.fwd#0", "(Worker.fwd)")


def test_more_than_one_input_node():
    w = Worker.bind()
    with InputNode() as inp1:
        a = w.fwd.bind(inp1)
    line = _next_line()
    with InputNode() as inp2:
        dag = w.add.bind(a, inp2)
    _raises(dag, "more than one InputNode", f"{FILE}:{line}", "input (graph input)")


def test_no_input_node():
    w = Worker.bind()
    line = _next_line()
    dag = MultiOutputNode([w.fwd.bind(1)])
    _raises(dag, "no InputNode", f"{FILE}:{line}")


def test_unencodable_constant_and_pickle_opt_in():
    w = Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        dag = w.fwd.bind(inp, scale=_Opaque())
    _raises(
        dag, "worker.fwd#0 (Worker.fwd)", f"{FILE}:{line}", "keyword 'scale'", "_Opaque", "allow"
    )
    res = trace(dag, allow_pickle=True)
    assert res.needs_trust
    assert res.graph.nodes[1].kwargs[0].arg.constant.WhichOneof("kind") == "pickled"


class _Opaque:
    pass


def test_unencodable_ctor_argument():
    line = _next_line()
    w = Worker.bind(_Opaque())
    with InputNode() as inp:
        dag = w.fwd.bind(inp)
    _raises(dag, "actor worker (Worker.__init__)", f"{FILE}:{line}", "argument 0")


def test_nccl_hint_on_input():
    w = Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        x = inp[0].with_tensor_transport("nccl")
        dag = w.fwd.bind(x)
    _raises(dag, "input[0] (graph input)", f"{FILE}:{line}", "NCCL", "driver")


def test_nccl_hint_with_cpu_device():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        x = w0.fwd.bind(inp).with_tensor_transport("nccl", device="cpu")
        dag = w1.fwd.bind(x)
    _raises(dag, "worker0.fwd#0 (Worker.fwd)", f"{FILE}:{line}", "device='cpu'")


def test_direct_return_on_a_multi_return_node():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        s = w0.split.options(num_returns=2).bind(inp).with_tensor_transport(_direct_return=True)
        a, b = s
        dag = w1.add.bind(a, b)
    _raises(
        dag, "worker0.split#0 (Worker.split)", f"{FILE}:{line}", "direct_return", "returns 2 values"
    )


def test_unknown_transport():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        x = w0.fwd.bind(inp).with_tensor_transport("carrier-pigeon")
        dag = w1.fwd.bind(x)
    _raises(dag, "worker0.fwd#0 (Worker.fwd)", f"{FILE}:{line}", "carrier-pigeon")


def test_mixing_whole_input_and_attributes():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        a = w0.fwd.bind(inp[0])
        line = _next_line()
        b = w1.fwd.bind(inp)
        dag = MultiOutputNode([a, b])
    _raises(dag, "worker1.fwd#0 (Worker.fwd)", f"{FILE}:{line}", "whole input", "input[0]")


def test_multi_return_used_as_one_value():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        s = w0.split.options(num_returns=2).bind(inp)
        line = _next_line()
        dag = w1.fwd.bind(s)
    _raises(
        dag, "worker1.fwd#0 (Worker.fwd)", f"{FILE}:{line}", "worker0.split#0 returns 2", "unpack"
    )


def test_output_must_hold_nodes():
    w = Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        dag = MultiOutputNode([w.fwd.bind(inp), 3])
    _raises(dag, f"{FILE}:{line}", "output", "int")
    with pytest.raises(CompileError, match="MultiOutputNode"):
        trace([w.fwd.bind(inp)])


def test_collective_bind_checks():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        a, b = w0.grad.bind(inp), w0.fwd.bind(inp)
        with pytest.raises(CompileError) as info:
            line = _next_line()
            allreduce.bind([a, b])
        assert f"{FILE}:{line}: allreduce.bind: actor Worker appears more than once" in str(
            info.value
        )
        with pytest.raises(CompileError, match="not an actor method's result"):
            allreduce.bind([inp, w1.grad.bind(inp)])
        with pytest.raises(CompileError, match="non-empty"):
            allreduce.bind([])


def test_collective_member_left_out_is_dangling():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        line = _next_line()
        r0, r1 = allreduce.bind([w0.grad.bind(inp), w1.grad.bind(inp)])
        dag = w0.fwd.bind(r0)
    _raises(dag, "worker1.allreduce#1 (Worker.allreduce)", f"{FILE}:{line}", "reaches no output")


def test_two_actors_with_one_name():
    A = cgc.actor(name="same")(m.Worker)
    w0 = A.bind()
    line = _next_line()
    w1 = A.bind()
    with InputNode() as inp:
        dag = MultiOutputNode([w0.fwd.bind(inp), w1.fwd.bind(inp)])
    _raises(dag, "named 'same'", f"{FILE}:{line}")


def test_negative_and_bad_input_keys():
    with InputNode() as inp:
        with pytest.raises(CompileError, match="negative"):
            inp[-1]
        with pytest.raises(CompileError, match="indexed by an int"):
            inp[1.5]


def test_class_defined_in_a_function_is_refused():
    class Local:
        def f(self, x):
            return x

    w = cgc.actor(Local).bind()
    with InputNode() as inp:
        dag = w.f.bind(inp)
    _raises(dag, "actor local (Local.__init__)", "defined inside a function")
