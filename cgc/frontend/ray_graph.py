"""Ray-side graph building that Ray itself only offers for live actor handles.

Used by ``record_ray_bind_sites()`` while a model is built: multi-return placeholders for
methods bound on a ``ClassNode`` and collectives among ``ClassNode`` actors. Both build
Ray's own node types, shaped exactly as Ray builds them for live handles, so the adapter
reads them the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["class_node_placeholders", "class_node_collective", "ray_num_returns"]


def ray_num_returns(body: Any, method: str, options: dict[str, Any]) -> int:
    """A ClassNode method's number of returns: ``.options(num_returns=)`` or ``@ray.method``."""
    n = options.get("num_returns")
    if n is None:
        n = getattr(getattr(body, method, None), "__ray_num_returns__", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def class_node_placeholders(unbound: Any, node: Any) -> Any:
    """``node``, or a tuple of ``return_idx_i`` placeholders when it returns several values."""
    from ray.dag.class_node import ClassMethodNode
    from ray.dag.constants import IS_CLASS_METHOD_OUTPUT_KEY, PARENT_CLASS_NODE_KEY

    actor = unbound._actor
    n = ray_num_returns(actor._body, unbound._method_name, unbound._options)
    if n <= 1:
        return node
    return tuple(
        ClassMethodNode(
            f"return_idx_{i}",
            (node, i),
            {},
            {},
            {IS_CLASS_METHOD_OUTPUT_KEY: True, PARENT_CLASS_NODE_KEY: actor},
        )
        for i in range(n)
    )


def _class_node_of(node: Any) -> Any:
    from ray.dag.class_node import ClassMethodNode, ClassNode

    if isinstance(node, ClassMethodNode) and isinstance(node._parent_class_node, ClassNode):
        return node._parent_class_node
    return None


def class_node_collective(inputs: Any, op: Any, transport: Any) -> list[Any] | None:
    """Ray's collective ``_bind`` for nodes of ClassNode actors; None for anything else
    (Ray's own ``_bind`` then handles it, e.g. live handles).

    Raises:
        ValueError: as Ray's: empty lists, duplicate actors or nodes, lists that disagree.
    """
    from ray.dag.collective_node import CollectiveOutputNode, _CollectiveOperation
    from ray.dag.constants import (
        COLLECTIVE_OPERATION_KEY,
        IS_CLASS_METHOD_OUTPUT_KEY,
        PARENT_CLASS_NODE_KEY,
        PREV_CLASS_METHOD_CALL_KEY,
    )
    from ray.experimental.channel.torch_tensor_type import TorchTensorType
    from ray.experimental.util.types import AllGatherOp, AllReduceOp, ReduceScatterOp

    if not isinstance(inputs, (list, tuple)) or not inputs:
        return None
    nested = isinstance(inputs[0], (list, tuple))
    lists = [list(x) for x in inputs] if nested else [list(inputs)]
    if not all(lists) or any(_class_node_of(n) is None for lst in lists for n in lst):
        return None
    if nested and not isinstance(op, AllReduceOp):
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
    if isinstance(op, AllGatherOp):
        method = "allgather"
    elif isinstance(op, (AllReduceOp, ReduceScatterOp)):
        method = f"{'allreduce' if isinstance(op, AllReduceOp) else 'reducescatter'}.{op.reduceOp}"
    else:
        raise ValueError(f"Expected a collective operation, but got {op}")
    coll = _CollectiveOperation.__new__(_CollectiveOperation)
    coll._actor_handles = actors  # ClassNodes stand in for handles here
    coll._op = op
    coll._type_hint = TorchTensorType(
        transport=transport or TorchTensorType.ACCELERATOR, _direct_return=True
    )
    out: list[Any] = []
    for rank, actor in enumerate(actors):
        member = CollectiveOutputNode(
            method,
            tuple(lst[rank] for lst in lists),
            {},
            {},
            {
                PARENT_CLASS_NODE_KEY: actor,
                PREV_CLASS_METHOD_CALL_KEY: actor._last_call,
                COLLECTIVE_OPERATION_KEY: coll,
            },
        )
        actor._last_call = member  # keep the per-actor bind chain, as ClassNode binds do
        if nested:
            member = [
                CollectiveOutputNode(
                    f"return_idx_{i}",
                    (member, i),
                    {},
                    {},
                    {IS_CLASS_METHOD_OUTPUT_KEY: True, PARENT_CLASS_NODE_KEY: actor},
                )
                for i in range(len(lists))
            ]
        out.append(member)
    return out
