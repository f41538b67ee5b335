"""Ray-side graph building that Ray itself only offers for live actor handles.

Used by ``record_ray_bind_sites()`` while a model is built: multi-return placeholders for
methods bound on a ``ClassNode`` and collectives among ``ClassNode`` actors. Both build
Ray's own node types, shaped exactly as Ray builds them for live handles, so the adapter
reads them the same way. Ray's internals are touched only through ``ray_private``.
"""

from __future__ import annotations

from typing import Any

from cgc.frontend import ray_private as rp

__all__ = ["class_node_placeholders", "class_node_collective", "ray_num_returns"]


def ray_num_returns(body: Any, method: str, options: dict[str, Any]) -> int:
    """A ClassNode method's number of returns: ``.options(num_returns=)`` or ``@ray.method``.

    >>> ray_num_returns(object, "missing", {"num_returns": 3})
    3
    >>> ray_num_returns(object, "missing", {})
    1

    Raises:
        Nothing; anything but a positive int counts as one return.
    """
    n = options.get("num_returns")
    if n is None:
        n = rp.declared_num_returns(getattr(body, method, None))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def class_node_placeholders(unbound: Any, node: Any) -> Any:
    """``node``, or a tuple of ``return_idx_i`` placeholders when it returns several values.

    Example: ``a, b = actor.two.bind(x)`` on a ClassNode (``two`` declared with
    ``@ray.method(num_returns=2)``) unpacks as it does on a live handle.

    Raises:
        RayVersionError: Ray's internals differ from the ones this was written for.
    """
    actor, method, options = rp.unbound_call(unbound)
    n = ray_num_returns(rp.actor_body(actor), method, options)
    if n <= 1:
        return node
    return tuple(rp.new_output_placeholder(node, i, actor, collective=False) for i in range(n))


def _class_node_of(node: Any) -> Any:
    from ray.dag import ClassMethodNode, ClassNode

    if isinstance(node, ClassMethodNode):
        parent = rp.parent_actor(node)
        if isinstance(parent, ClassNode):
            return parent
    return None


def class_node_collective(inputs: Any, op: Any, transport: Any) -> list[Any] | None:
    """Ray's collective ``_bind`` for nodes of ClassNode actors; None for anything else
    (Ray's own ``_bind`` then handles it, e.g. live handles).

    Example: ``r0, r1 = allreduce.bind([w0.grad.bind(x), w1.grad.bind(x)])`` with
    ``w0, w1`` made by ``Worker.bind()``.

    Raises:
        ValueError: as Ray's: empty lists, duplicate actors or nodes, lists that disagree.
        RayVersionError: Ray's internals differ from the ones this was written for.
    """
    if not isinstance(inputs, (list, tuple)) or not inputs:
        return None
    nested = isinstance(inputs[0], (list, tuple))
    lists = [list(x) for x in inputs] if nested else [list(inputs)]
    if not all(lists) or any(_class_node_of(n) is None for lst in lists for n in lst):
        return None
    kind = rp.collective_kind(op)
    if nested and kind != "allreduce":
        raise ValueError(
            "Currently binding a nested list of dag nodes is only supported for allreduce"
        )
    actors = [_class_node_of(n) for n in lists[0]]
    for lst in lists:
        row = [_class_node_of(n) for n in lst]
        if len(set(map(id, row))) != len(row) or len(set(map(id, lst))) != len(lst):
            raise ValueError(f"Expected unique actors and input nodes, got {lst}")
        if [id(a) for a in row] != [id(a) for a in actors]:
            raise ValueError("Expected all input lists to have the same actors in the same order")
    if kind is None:
        raise ValueError(f"Expected a collective operation, but got {op}")
    # Ray names a member's method after the operation, e.g. "allreduce.ReduceOp.SUM".
    method = kind if kind == "allgather" else f"{kind}.{rp.reduce_op(op)}"
    coll = rp.new_collective_operation(actors, op, transport)
    out: list[Any] = []
    for rank, actor in enumerate(actors):
        member = rp.new_collective_member(method, tuple(lst[rank] for lst in lists), actor, coll)
        if nested:
            member = [
                rp.new_output_placeholder(member, i, actor, collective=True)
                for i in range(len(lists))
            ]
        out.append(member)
    return out
