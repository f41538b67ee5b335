"""The run's TCP frame limit (``start(max_frame_bytes=)``) on a whole graph."""

from __future__ import annotations

import pytest
import rt_graphs as G

import cgc
from cgc import InputNode, MultiOutputNode
from cgc.plan_schema.errors import ConfigError


def test_a_value_over_the_runs_frame_limit_is_that_executions_error(ray_cluster):
    """``max_frame_bytes`` reaches every TCP channel of the graph: a result over it is
    refused before it is sent and becomes its execution's error; nothing shifts."""
    w = G.Worker.bind()
    with InputNode() as inp:
        a, b = w.split.bind(inp)
        plan = cgc.compile(MultiOutputNode([a, b]), name="t_frames")
    with plan.start(host_transport="tcp", max_frame_bytes=64 * 1024, get_timeout=60) as g:
        assert set(g.channel_bindings.values()) == {"tcp"}
        assert [r.get() for r in g.execute("ab")] == ["ab", "abab"]
        # The doubled output is 80 kB: refused before sending, named, the execution's
        # error (on its sibling output too: one execution fails as a whole).
        for ref in g.execute("x" * 40_000):
            with pytest.raises(TypeError, match="worker.split.*maximum of 65536 bytes"):
                ref.get()
        assert [r.get() for r in g.execute("cd")] == ["cd", "cdcd"]


def test_a_frame_limit_below_64_kib_is_refused():
    with pytest.raises(ConfigError, match="max_frame_bytes"):
        G.echo_plan().start(max_frame_bytes=1000)
