"""Fault suite, TCP path (loopback, ``host_transport="tcp"``): injected delays at every stage
of a diamond, small and multi-megabyte values mixed (frames that span many segments), many
executions in flight and results fetched out of order; every result is the right one.

TCP itself never reorders bytes; what reorders here is completion: each stage sleeps a
different pseudo-random time per execution, so the branches and the driver's output
readers see executions at different moments."""

from __future__ import annotations

import random

import fault_graphs as F
import numpy as np


def _input(i: int) -> tuple[int, np.ndarray]:
    n = (1 << 18) if i % 5 == 0 else 1 + i % 7  # every fifth: 2 MiB of float64
    return i, np.arange(n, dtype=np.float64) + i


def test_injected_delays_on_tcp_keep_results_correct_and_in_order(ray_cluster,
                                                                    leaves_nothing):
    n = 60
    rnd = random.Random(7)
    with F.jittery_diamond().start(host_transport="tcp", get_timeout=60) as g:
        assert set(g.channel_bindings.values()) == {"tcp"}
        pending: dict[int, object] = {}
        for i in range(n):
            pending[i] = g.execute(_input(i))
            # Fetch a random earlier one now and then (out of order), keep up to 4 in flight.
            while len(pending) >= 4 or (pending and rnd.random() < 0.3):
                j = rnd.choice(sorted(pending))
                got_i, got = pending.pop(j).get()
                _, x = _input(j)
                assert got_i == j and np.array_equal(got, x * 5), j  # 1*2 + 1*3
        for j in sorted(pending, reverse=True):
            got_i, got = pending.pop(j).get()
            assert got_i == j and np.array_equal(got, _input(j)[1] * 5), j
    leaves_nothing(g)

