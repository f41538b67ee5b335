"""What cannot be a static graph fails at trace time: a typed error naming the user's line.

Each step below marks the offending line with a ``# <- name`` comment; the error's ``loc``
(and the start of its message) must be this file at that line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
import trace_models as tm

import cgc
from cgc.errors import (
    ActorInStepError,
    CompileError,
    EscapedRefError,
    GetInStepError,
    RefUsedAsValueError,
    TaskInStepError,
    TraceError,
)
from cgc.frontend.step_tracer import trace_step

HERE = Path(__file__)
KEPT: list = []
GLOBAL_REF = None


def _line(marker: str) -> str:
    for i, text in enumerate(HERE.read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# <- {marker}"):
            return f"{HERE.name}:{i}"
    raise AssertionError(f"no marker {marker}")


@pytest.fixture(scope="module")
def w(ray_cluster):
    h = tm.Stage.remote(2.0)
    ray.get(h.fwd.remote(0))
    yield h
    ray.kill(h)


def _refused(step, error: type[TraceError], marker: str, args=(1,)) -> TraceError:
    with pytest.raises(error) as info:
        cgc.compile(step, example_inputs=args)
    exc = info.value
    assert isinstance(exc, CompileError)
    where = _line(marker)
    assert exc.loc == where, (exc.loc, where, str(exc))
    assert str(exc).startswith(where)
    return exc


def test_ray_get_and_wait_inside_the_step(w):
    def get(x):
        h = w.fwd.remote(x)
        return w.fwd.remote(ray.get(h))  # <- get

    exc = _refused(get, GetInStepError, "get")
    assert "ray.get()" in str(exc) and "Stage.fwd" in str(exc)

    def wait(x):
        h = w.fwd.remote(x)
        ray.wait([h])  # <- wait
        return h

    _refused(wait, GetInStepError, "wait")


@pytest.mark.parametrize("use", ["bool", "add", "radd", "index", "iter", "len", "attr",
                                 "compare", "int", "format_index"])
def test_a_ref_used_as_a_python_value(w, use):
    def step(x):
        h = w.fwd.remote(x)
        if use == "bool":
            if h:  # <- bool
                pass
        elif use == "add":
            h = h + 1  # <- add
        elif use == "radd":
            h = 1 + h  # <- radd
        elif use == "index":
            h = h[0]  # <- index
        elif use == "iter":
            for _ in h:  # <- iter
                pass
        elif use == "len":
            len(h)  # <- len
        elif use == "attr":
            h.shape  # <- attr  # noqa: B018
        elif use == "compare":
            h < 3  # <- compare  # noqa: B015
        elif use == "int":
            int(h)  # <- int
        elif use == "format_index":
            [1, 2][h]  # <- format_index  # noqa: B015
        return h

    marker = use
    src = HERE.read_text()
    if f"# <- {use}  #" in src:  # lines that carry a noqa after the marker
        where = next(f"{HERE.name}:{i}" for i, t in enumerate(src.splitlines(), start=1)
                     if f"# <- {use}  #" in t)
        with pytest.raises(RefUsedAsValueError) as info:
            cgc.compile(step, example_inputs=(1,))
        assert info.value.loc == where, str(info.value)
        assert isinstance(info.value, TypeError)
        return
    exc = _refused(step, RefUsedAsValueError, marker)
    assert "no value" in str(exc)


def test_an_argument_of_the_step_is_no_value_either(w):
    def step(x, n):
        for _ in range(n):  # <- range
            x = w.fwd.remote(x)
        return x

    _refused(step, RefUsedAsValueError, "range", args=(1, 2))


def test_a_task_in_the_step(w):
    def step(x):
        return tm.task.remote(x)  # <- task

    exc = _refused(step, TaskInStepError, "task")
    assert "task.remote()" in str(exc) and "actor" in str(exc)


def test_an_actor_created_in_the_step(w):
    def step(x):
        other = tm.Stage.remote()  # <- actor
        return other.fwd.remote(x)

    exc = _refused(step, ActorInStepError, "actor")
    assert "Stage" in str(exc)
    # ActorClass._remote is Ray's again after the failed trace
    h = tm.Stage.remote(5.0)
    assert ray.get(h.fwd.remote(1)) == 5.0
    ray.kill(h)


def test_a_ref_escaping_to_a_global(w):
    def step(x):
        global GLOBAL_REF
        GLOBAL_REF = w.fwd.remote(x)  # <- global
        return GLOBAL_REF

    exc = _refused(step, EscapedRefError, "global")
    assert "GLOBAL_REF" in str(exc)

    def append(x):
        h = w.fwd.remote(x)  # <- made
        KEPT.append(h)  # <- kept
        return h

    # named first: the line where the ref escaped; then the line that made it
    exc = _refused(append, EscapedRefError, "kept")
    assert "KEPT" in str(exc) and f"(made at {_line('made')})" in str(exc)
    KEPT.clear()


def test_a_ref_escaping_to_an_enclosing_variable(w):
    last = None

    def step(x):
        nonlocal last
        last = w.fwd.remote(x)  # <- closure
        return last

    exc = _refused(step, EscapedRefError, "closure")
    assert "last" in str(exc)


class _Holder:
    """An object the step keeps a ref in: not a place tracing scans, so the ref is caught
    where it is used next."""

    def __init__(self) -> None:
        self.refs: list = []


def test_a_ref_used_in_a_later_step(w):
    holder = _Holder()

    def keeper(x):
        r = w.fwd.remote(x)
        holder.refs.append(r)
        return r

    trace_step(keeper, (1,))

    def later(x):
        return w.fwd.remote(holder.refs[0])  # <- later

    exc = _refused(later, EscapedRefError, "later")
    assert "after the trace of keeper()" in str(exc)
    with pytest.raises(EscapedRefError):
        ray.get(holder.refs[0])  # ray.get after the trace is no value either
    with pytest.raises(EscapedRefError):
        ray.put(holder.refs[0])  # nor can it be pickled


def test_a_ref_nested_in_a_container_argument(w):
    def step(x):
        h = w.fwd.remote(x)
        return w.add.remote([h], 1)  # <- nested

    exc = _refused(step, TraceError, "nested")
    assert "nested" in str(exc) and "unresolved" in str(exc)


def test_returning_something_that_is_not_a_ref(w):
    def step(x):
        w.fwd.remote(x)
        return 3

    with pytest.raises(TraceError, match="returns a int"):
        cgc.compile(step, example_inputs=(1,))


def test_ray_is_restored_after_every_trace(w):
    import ray.actor
    import ray.remote_function

    before = (ray.get, ray.wait, ray.actor.ActorMethod._remote, ray.actor.ActorClass._remote,
              ray.remote_function.RemoteFunction._remote)

    def bad(x):
        raise RuntimeError("user bug")

    with pytest.raises(RuntimeError, match="user bug"):
        cgc.compile(bad, example_inputs=(1,))
    after = (ray.get, ray.wait, ray.actor.ActorMethod._remote, ray.actor.ActorClass._remote,
             ray.remote_function.RemoteFunction._remote)
    assert before == after
    assert ray.get(w.fwd.remote(1)) == 2.0
    assert os.path.exists(HERE)


def test_an_allgather_cannot_keep_ray_s_result(w):
    from ray.experimental.collective import allgather

    other = tm.Stage.remote()

    def step(x):
        g0, g1 = allgather.bind([w.fwd.remote(x), other.fwd.remote(x)])  # <- allgather
        return [g0, g1]

    try:
        exc = _refused(step, TraceError, "allgather")
        assert "concatenated" in str(exc)
    finally:
        ray.kill(other)
