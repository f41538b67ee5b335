"""Ray's private ``CompiledDAG.actor_to_execution_schedule`` read off the plan: per actor
handle, one execution of its program (prologue, then the loop's same-execution ops) as Ray's
``_DAGNodeOperation``s, in cgc's order (docs/ray_compat.md says where it differs from Ray's).
Tasks are numbered by bind order on their actor, as Ray numbers them; a task whose input or
output stays in the actor (no op in cgc) gets Ray's READ just before, WRITE just after, its
COMPUTE: Ray lists all three for every task."""

from __future__ import annotations

from typing import Any

from cgc.plan_schema import plan_pb2 as pb

_OP_TYPES = {pb.READ: "READ", pb.RECV: "READ", pb.COMPUTE: "COMPUTE", pb.COLL: "COMPUTE",
             pb.WRITE: "WRITE", pb.SEND: "WRITE"}  # cgc op kind -> Ray's operation type


def _order(program: pb.Program) -> list[tuple[int, str]]:
    """One execution of ``program`` as (task node id, Ray op type), three per task."""
    ops = [(o.task, _OP_TYPES[o.kind]) for o in [*program.prologue, *(
        o for o in program.ops if o.exec_offset == 0)] if o.kind in _OP_TYPES]
    out: list[tuple[int, str]] = []
    for task, kind in ops:
        pre = [(task, "READ")] if kind == "COMPUTE" and (task, "READ") not in ops else []
        post = [(task, "WRITE")] if kind == "COMPUTE" and (task, "WRITE") not in ops else []
        out += [op for op in [*pre, (task, kind), *post] if op not in out]
    return out


def execution_schedule(plan: Any) -> dict[Any, list[Any]]:
    """Each live actor's handle -> its program as Ray's ``_DAGNodeOperation`` list.

    Example::

        >>> class _Plan:  # no actors, no schedule
        ...     proto, live_handles = pb.Plan(), {}
        >>> execution_schedule(_Plan())
        {}

    Raises:
        KeyError: a program's actor has no live handle (a plan not compiled from Ray's DAG).
    """
    from ray.dag.dag_node_operation import _DAGNodeOperation, _DAGNodeOperationType

    g = plan.proto.graph
    calls = sorted((n.actor, n.bind_index, n.id) for n in g.nodes
                   if n.kind in (pb.CALL, pb.COLLECTIVE) and n.actor)
    idx = {i: r - [a for a, _, _ in calls].index(a) for r, (a, _, i) in enumerate(calls)}
    method = {n.id: n.method for n in g.nodes}
    return {plan.live_handles[p.actor]: [
        _DAGNodeOperation(idx[t], _DAGNodeOperationType[k], method[t]) for t, k in _order(p)]
        for p in plan.proto.lowered.programs}
