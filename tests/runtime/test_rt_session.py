"""The session gate: a cgc thread's Ray call and the end of its Ray session never overlap
(unit level; ``tests/ray_compat/test_compat_shutdown.py`` runs ``ray.shutdown()`` itself)."""

from __future__ import annotations

import threading

import pytest

from cgc.runtime import ray_internals
from cgc.runtime.driver import session


@pytest.fixture
def gate(monkeypatch):
    # The gate asks which Ray connection this process has; here it is always "s1".
    monkeypatch.setattr(session, "ray_session", lambda: "s1")
    return session._Gate()


def test_closing_waits_for_a_call_inside_then_refuses_new_ones(gate):
    inside, release, closed = threading.Event(), threading.Event(), threading.Event()

    def caller():
        with gate.calls("s1") as ok:
            assert ok
            inside.set()
            release.wait(10)

    t = threading.Thread(target=caller)
    t.start()
    assert inside.wait(10)
    closer = threading.Thread(target=lambda: (gate.close("s1"), closed.set()))
    closer.start()
    assert not closed.wait(0.3)  # the call is still inside Ray: the session cannot end
    release.set()
    assert closed.wait(10)
    t.join(10)
    closer.join(10)
    with gate.calls("s1") as ok:
        assert not ok
    assert gate.closed("s1")


def test_other_sessions_and_no_session_are_refused(gate):
    with gate.calls("s0") as ok:  # not this process's connection
        assert not ok
    with gate.calls("") as ok:  # no Ray at all
        assert not ok


def test_a_thread_may_close_while_inside_its_own_call(gate):
    # ray.shutdown() from a thread that is itself inside a guarded call must not wait on itself.
    with gate.calls("s1") as ok:
        assert ok
        gate.close("s1")
    assert gate.closed("s1")


def test_the_ray_internals_the_runtime_uses_exist():
    assert ray_internals.missing_internals() == []
    assert ray_internals.compiled_dag_registry() is not None
