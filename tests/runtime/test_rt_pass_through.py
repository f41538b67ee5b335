"""Arrays passed through actors unchanged: right bytes, results that outlive the graph."""

from __future__ import annotations

import gc

import numpy as np
import rt_graphs as G
import torch

import cgc
from cgc import InputNode

MiB = 1 << 20


def _pass_plan():
    a, b = G.Echo.bind(), G.Echo.bind()
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    return cgc.compile(dag, name="t_pass")


def test_pass_through_chain_returns_the_same_bytes(ray_cluster):
    x = np.random.default_rng(0).standard_normal(2 * MiB)  # 16 MiB
    t = torch.arange(MiB, dtype=torch.int32)
    with _pass_plan().start(get_timeout=60) as g:
        results = []
        for i in range(6):
            got = g.execute(x + i).get()
            assert np.array_equal(got, x + i)
            results.append(got)  # several held at once: none may be overwritten
        got = g.execute({"a": (x, 3), "t": t}).get()  # inside containers, and a tensor
        assert got["a"][1] == 3 and np.array_equal(got["a"][0], x)
        assert torch.equal(got["t"], t)
        assert all(np.array_equal(r, x + i) for i, r in enumerate(results))
        held = g.execute(x * 2).get()
    gc.collect()
    # After teardown the held result still has its bytes.
    assert np.array_equal(held, x * 2)
    assert all(np.array_equal(r, x + i) for i, r in enumerate(results))


def test_echo_of_a_large_array_returns_it_many_times(ray_cluster):
    with G.echo_plan().start(get_timeout=60) as g:
        for i in range(20):
            x = np.full(MiB // 8, i, dtype=np.float64)  # 1 MiB
            assert np.array_equal(g.execute(x).get(), x)
