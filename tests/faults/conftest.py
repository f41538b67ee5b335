"""Fixtures of the fault suite: every case checks that nothing is left behind."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from leaks import alive, cgc_threads, children, wait_until  # noqa: E402 - needs the path


@pytest.fixture
def leaves_nothing():
    """Yields a ``check(graph, pids)`` to call after teardown: no segment under the graph's
    prefix, no cgc thread in the driver, no socket more than before, created actors gone,
    no child process more than before (but the driver's one janitor, see
    ``cgc.runtime.channels.janitor``)."""
    before_threads = cgc_threads()
    before_fds = len(os.listdir("/proc/self/fd"))
    before_children = children()

    def check(graph, pids=()):
        from cgc.runtime.channels import janitor, list_segments

        assert graph.closing
        assert list_segments(graph.prefix) == [], "segments left behind"
        assert wait_until(lambda: cgc_threads() <= before_threads), cgc_threads()
        assert wait_until(lambda: not any(alive(p) for p in pids)), "actor processes left"
        allowed = before_children | {janitor.janitor_pid()}
        assert wait_until(lambda: children() <= allowed), children() - allowed
        # Sockets and files of the driver: none more than before (allow Ray's own churn).
        assert len(os.listdir("/proc/self/fd")) <= before_fds + 8

    return check
