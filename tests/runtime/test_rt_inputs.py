"""Inputs that cannot be sent (issue 20): a lambda, a generator or a lock given to
``execute()`` is a typed ``InputSerializationError`` naming the argument, never a raw
``AttributeError``/``TypeError`` from pickle, and the graph keeps working; when the bad
argument is not the first input channel, the execution fails as a whole (the others
already hold its values) without breaking the graph.
"""

from __future__ import annotations

import threading

import pytest
import rt_graphs as G

import cgc
from cgc import InputNode, MultiOutputNode
from cgc.runtime import InputMismatchError, InputSerializationError

UNSENDABLE = {
    "lambda": lambda: (lambda: 0),
    "generator": lambda: (i for i in range(3)),
    "lock": threading.Lock,
}


@pytest.fixture(scope="module")
def echo(ray_cluster):
    with G.echo_plan().start(get_timeout=30) as g:
        yield g


@pytest.fixture(scope="module")
def two_inputs(ray_cluster):
    a, b = G.Worker.bind(0), G.Worker.bind(100)
    with InputNode() as inp:
        dag = MultiOutputNode([a.add.bind(inp[0]), b.add.bind(inp[1]), b.add.bind(inp.k)])
    with cgc.compile(dag, name="t_two_inputs").start(get_timeout=30) as g:
        yield g


@pytest.mark.parametrize("kind", sorted(UNSENDABLE))
def test_an_unsendable_input_is_a_typed_error_naming_it(echo, kind):
    with pytest.raises(InputSerializationError, match="the input") as ei:
        echo.execute(UNSENDABLE[kind]())
    err = ei.value
    assert isinstance(err, InputMismatchError) and isinstance(err, TypeError)
    assert err.argument == "the input" and "cannot be sent" in str(err)
    assert echo.execute("still fine").get() == "still fine"


@pytest.mark.parametrize("position", [0, 1, "k"])
def test_an_unsendable_later_input_fails_that_execution_only(two_inputs, position):
    # three input channels: for two of the cases the bad one is not written first
    assert len(two_inputs.plan.proto.lowered.input_channels) == 3
    args, kwargs = [1, 2], {"k": 3}
    if position == "k":
        kwargs["k"] = threading.Lock()
        name = "keyword argument 'k'"
    else:
        args[position] = lambda: 0
        name = f"positional argument {position}"
    with pytest.raises(InputSerializationError) as ei:
        two_inputs.execute(*args, **kwargs)
    assert ei.value.argument == name
    # the graph is whole: more executions than its capacity all come back right
    n = two_inputs.capacity + 2
    refs = [two_inputs.execute(i, 10 * i, k=i) for i in range(n)]
    assert [[r.get() for r in rs] for rs in refs] == [[i, 10 * i + 100, i + 100]
                                                     for i in range(n)]
    assert two_inputs.buffered == 0
