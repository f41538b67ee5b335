"""cgc's frontend: the builder API (named like Ray's DAG API), the Ray DAG adapter and
``trace()``, which turns either into a checked, deterministic ``pb.Graph``.

Example::

    import cgc
    from cgc.frontend import InputNode, trace

    @cgc.actor
    class Worker:
        def fwd(self, x):
            return x + 1

    w = Worker.bind()
    with InputNode() as inp:
        dag = w.fwd.bind(inp)
    graph = trace(dag).graph

Ray's own objects (``ray.dag.InputNode``, ``@ray.remote`` classes' ``.bind()``) are traced
the same way; ``record_ray_bind_sites()`` notes their source lines while a model is built.
Every read of Ray's internals goes through ``ray_private`` (one table of what is used).

Where a check goes: each kind of check has one home, chosen by what it needs to know.

====================================  ====================================================
the check needs                       home
====================================  ====================================================
only the ``.bind()`` call's own       the builder (``nodes``, ``actors``, ``collectives``):
arguments (types, counts, member      raise at once, so the traceback points at the line
lists of a collective)
one node or one actor, with final     ``node_checks``: method and signature, constants,
names (trace time)                    transport hints, constructor, class, options
several nodes: the graph's shape      ``graph_checks``: output, hidden nodes, cycles,
(trace time)                          inputs, dangling results, duplicate actor names
a Ray DAG object cgc cannot express   ``ray_adapter`` (e.g. Ray remote functions)
placement (which actor has a GPU,     the passes (``cgc.passes``), after tracing
NCCL to the driver)
====================================  ====================================================

Trace-time checks report through ``reporter.Names`` so every message reads
``model.py:14: w1.fwd#2 (Worker.fwd): <what is wrong>; <how to fix it>``.
"""

from __future__ import annotations

from typing import Any

from cgc.frontend.actors import ActorClass, LazyActor, actor, method
from cgc.frontend.collectives import ReduceOp, allgather, allreduce, reducescatter
from cgc.frontend.nodes import (
    CallNode,
    DAGNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
    OutputRef,
)
from cgc.frontend.tracer import TraceResult, trace
from cgc.frontend.weight_sync import WeightSpec, weight_sync

__all__ = [
    "actor",
    "method",
    "InputNode",
    "MultiOutputNode",
    "allreduce",
    "allgather",
    "reducescatter",
    "ReduceOp",
    "trace",
    "TraceResult",
    "record_ray_bind_sites",
    "ActorClass",
    "LazyActor",
    "DAGNode",
    "CallNode",
    "OutputRef",
    "InputAttributeNode",
    "WeightSpec",
    "weight_sync",
]


def __getattr__(name: str) -> Any:
    # The Ray adapter imports Ray; load it only when asked for.
    if name == "record_ray_bind_sites":
        from cgc.frontend.ray_sites import record_ray_bind_sites

        return record_ray_bind_sites
    raise AttributeError(f"module 'cgc.frontend' has no attribute {name!r}")
