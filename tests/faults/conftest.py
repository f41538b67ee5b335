"""Fixtures of the fault suite: every case checks that nothing is left behind."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def cgc_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("cgc-")}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] not in "ZX"
    except OSError:
        return False


def wait_until(cond, deadline_s: float = 20.0, step: float = 0.05) -> bool:
    """Poll ``cond`` until it holds or the (generous) deadline passes; return the outcome."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


@pytest.fixture
def leaves_nothing():
    """Yields a ``check(graph, pids)`` to call after teardown: no segment under the graph's
    prefix, no cgc thread in the driver, no socket more than before, created actors gone."""
    before_threads = cgc_threads()
    before_fds = len(os.listdir("/proc/self/fd"))

    def check(graph, pids=()):
        from cgc.runtime.channels import list_segments

        assert graph.closing
        assert list_segments(graph.prefix) == [], "segments left behind"
        assert wait_until(lambda: cgc_threads() <= before_threads), cgc_threads()
        assert wait_until(lambda: not any(alive(p) for p in pids)), "actor processes left"
        # Sockets and files of the driver: none more than before (allow Ray's own churn).
        assert len(os.listdir("/proc/self/fd")) <= before_fds + 8

    return check
