"""The driver's semantics that Ray Compiled Graph programs rely on, through cgc's own API:
fail-fast across an execution's outputs, raise-at-capacity, and the buffered-results limit
on every path."""

from __future__ import annotations

import threading
import time

import pytest
import rt_graphs as G

from cgc.runtime import CapacityExceededError, GetTimeoutError, ResultBufferFullError


def test_an_error_output_fails_every_ref_of_its_execution_without_waiting(ray_cluster):
    with G.error_and_slow_plan().start(get_timeout=20) as g:
        err, slow = g.execute(-1, 60.0)
        # Output 0 is an error: the execution is complete, however long output 1 takes.
        # If get() waited for the slow sibling it would end in GetTimeoutError instead.
        with pytest.raises(G.AppError, match="negative input -1"):
            slow.get()
        with pytest.raises(G.AppError):
            err.get()


def test_fail_fast_does_not_wait_for_a_slow_output_listed_before_the_error(ray_cluster):
    with G.error_and_slow_plan(slow_first=True).start(get_timeout=20) as g:
        slow, err = g.execute(-1, 60.0)
        # Output 0 sleeps 60 s, beyond the 20 s get timeout: had get() sat on it, this
        # would be a GetTimeoutError, not the sibling's error.
        with pytest.raises(G.AppError, match="negative input -1"):
            slow.get()
        with pytest.raises(G.AppError):
            err.get()


def test_later_executions_keep_their_own_values_after_a_fail_fast(ray_cluster):
    with G.error_and_slow_plan().start(get_timeout=30) as g:
        first = g.execute(-1, 0.3)
        second = g.execute(5, 0.0)
        with pytest.raises(G.AppError):
            first[1].get()
        # Output 1 of the failed execution is read later and never shifts execution 2.
        assert [r.get() for r in second] == [5, 0.0]
        assert [r.get() for r in g.execute(7, 0.0)] == [7, 0.0]


def test_raise_at_capacity(ray_cluster):
    with G.slow_plan().start(at_capacity="raise", get_timeout=30) as g:
        refs = [g.execute(0.2) for _ in range(g.capacity)]
        with pytest.raises(CapacityExceededError, match="in flight"):
            g.execute(0.0)
        assert refs[0].get() == 0.2
        more = g.execute(0.0)  # room again once one result was read
        assert [r.get() for r in refs[1:]] == [0.2] * (len(refs) - 1)
        assert more.get() == 0.0


@pytest.mark.parametrize("mode", ["raise", "wait"])
def test_dropped_refs_free_their_places_at_capacity(ray_cluster, mode):
    # Issue 21's sequence: a ref dropped unfetched holds its place only until its result is
    # read; at capacity execute() reads (and frees) it instead of counting it as in flight.
    with G.slow_plan().start(capacity=2, at_capacity=mode, get_timeout=30) as g:
        assert g.execute(0.0).get() == 0.0
        g.execute(0.3)  # dropped at once
        g.execute(0.3)  # dropped at once
        assert g.execute(0.1).get() == 0.1
        assert g.buffered == 0 and g.in_flight() == 0
        # A ref still held keeps its place: raise mode still raises at capacity.
        kept = [g.execute(0.2), g.execute(0.2)]
        if mode == "raise":
            with pytest.raises(CapacityExceededError, match="in flight") as info:
                g.execute(0.0)
            assert (info.value.in_flight, info.value.capacity) == (2, 2)
        assert [r.get() for r in kept] == [0.2, 0.2]


def test_buffered_results_limit_holds_on_get(ray_cluster):
    with G.chain_plan(2).start(max_buffered_results=1, get_timeout=30) as g:
        refs = [g.execute(i) for i in range(3)]
        with pytest.raises(ResultBufferFullError, match="max_buffered_results=1"):
            refs[2].get()  # would buffer executions 0 and 1
        # Nothing was lost: every result is still there, in order.
        assert [r.get() for r in refs] == [3, 4, 5]
        assert g.buffered == 0


def test_buffered_results_limit_counts_the_execution_being_read(ray_cluster):
    # Ray's count: with a limit of 1, reading execution 1 while execution 0 is unfetched
    # would hold two results.
    with G.chain_plan(2).start(max_buffered_results=1, get_timeout=30) as g:
        first, second = g.execute(1), g.execute(2)
        with pytest.raises(ResultBufferFullError, match="unfetched: 0"):
            second.get()
        assert first.get() == 4
        assert second.get() == 5


def test_a_submit_waiting_for_a_buffer_place_goes_on_when_a_get_frees_one(ray_cluster):
    # Capacity 2, at most one buffered result: the 4th execute is at capacity and the
    # result it would read to make room has no buffer place, so it waits until a get() in
    # another thread frees the buffered one. A lost wake-up would end the wait only at
    # the submit timeout (30 s), after the join below gave up.
    with G.chain_plan(2).start(capacity=2, max_buffered_results=1, submit_timeout=30,
                               get_timeout=30) as g:
        refs = [g.execute(i) for i in range(3)]
        late: list = []
        t = threading.Thread(target=lambda: late.append(g.execute(3)), daemon=True)
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "execute() did not wait for a buffer place"
        assert refs[0].get() == 3
        t.join(10)
        assert not t.is_alive(), "execute() was not woken when a result was freed"
        assert [r.get() for r in refs[1:]] + [late[0].get()] == [4, 5, 6]


def test_get_timeout_loses_nothing_and_fail_fast_keeps_positions(ray_cluster):
    with G.error_and_slow_plan().start(get_timeout=30) as g:
        refs = g.execute(1, 1.0)
        with pytest.raises(GetTimeoutError):
            refs[1].get(timeout=0.1)
        assert [r.get() for r in refs] == [1, 1.0]
