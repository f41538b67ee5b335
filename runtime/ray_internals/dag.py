"""Accessors that read (and, for ClassNode collectives, build) Ray's DAG nodes."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from cgc.runtime.ray_internals.check import _get, _import, mismatch
from cgc.runtime.ray_internals.table import _CLS, _COLL, _TT


def scan_nodes(values: list[Any]) -> list[Any]:
    """The Ray DAG nodes found in ``values`` (nested in lists, dicts, ...), in order.

    Raises:
        RayVersionError: Ray's scanner is gone.
    """
    scanner = _import("ray.dag.py_obj_scanner", "_PyObjScanner")()
    try:
        return list(scanner.find_nodes(values))
    finally:
        scanner.clear()


def bound_args(node: Any) -> tuple[Any, ...]:
    """A node's positional arguments (a ClassNode's constructor arguments)."""
    return tuple(_get(node, "_bound_args"))


def bound_kwargs(node: Any) -> dict[str, Any]:
    """A node's keyword arguments."""
    return dict(_get(node, "_bound_kwargs"))


def other_args(node: Any) -> dict[str, Any]:
    """Ray's links to parent nodes (actor, previous call, collective operation)."""
    return dict(_get(node, "_bound_other_args_to_resolve"))


def downstream(node: Any) -> list[Any]:
    """The nodes that consume ``node``."""
    return list(_get(node, "_downstream_nodes"))


def upstream(node: Any) -> list[Any]:
    """The nodes ``node`` consumes (arguments first, then Ray's links), in Ray's order."""
    return list(_get(node, "_upstream_nodes"))


def nested_flag(node: Any) -> bool:
    """Ray's own record that a positional argument of ``node`` hides a node in a
    container (Ray refuses such a graph at compile time)."""
    return bool(_get(node, "_args_contain_nested_dag_node"))


def bound_options(node: Any) -> dict[str, Any]:
    """A ClassNode's actor options, or a call's ``.options(...)``."""
    return dict(_get(node, "_bound_options"))


def input_attributes(input_node: Any) -> list[Any]:
    """The ``inp[k]`` / ``inp.k`` nodes made of an InputNode so far."""
    return list(_get(input_node, "input_attribute_nodes").values())


def attribute_source(node: Any) -> tuple[Any, Any]:
    """(InputNode, key) of an ``inp[k]`` node."""
    return _get(node, "_dag_input_node"), _get(node, "key")


def parent_actor(node: Any) -> Any:
    """The actor a call is bound on: a ClassNode or a live ActorHandle."""
    return _get(node, "_parent_class_node")


def method_name(node: Any) -> str:
    """The method a ClassMethodNode calls."""
    return str(_get(node, "get_method_name")())


def output_of(node: Any) -> tuple[Any, int] | None:
    """(call, index) when ``node`` is output ``index`` of a multi-return call, else None."""
    if not _get(node, "is_class_method_output"):
        return None
    return _get(node, "class_method_call"), int(_get(node, "output_idx"))


def live_bind_index(node: Any) -> int:
    """The bind order of a call on a live handle (0 when Ray did not number it)."""
    return int(_get(node, "_bind_index") or 0)


def actor_body(class_node: Any) -> Any:
    """The class of a ClassNode (or the function of a FunctionNode) as Ray holds it."""
    return _get(class_node, "_body")


def call_chain(class_node: Any) -> list[Any]:
    """The calls bound on a ClassNode, first bind first."""
    chain, call = [], _get(class_node, "_last_call")
    while call is not None:
        chain.append(call)
        call = _get(call, "_prev_class_method_call")
    return chain[::-1]


@dataclass(frozen=True)
class RayTypeHint:
    """A Ray type hint, as Ray stores it: ``auto`` for ``AutoTransportType``; otherwise
    a tensor hint with Ray's transport name (``"accelerator"``, ``"auto"``, ...) and the
    named communicator, if any."""

    auto: bool
    transport: str
    communicator: Any
    device: str
    static_shape: bool
    direct_return: bool


def _type_hint(hint: Any) -> RayTypeHint | None:
    auto = _import("ray.experimental.channel.auto_transport_type", "AutoTransportType")
    tensor = _import("ray.experimental.channel.torch_tensor_type", "TorchTensorType")
    if isinstance(hint, auto):
        transport, communicator = "auto", None
    elif isinstance(hint, tensor):
        transport, communicator = _get(hint, "transport"), _get(hint, "_communicator")
    else:
        return None
    return RayTypeHint(
        auto=isinstance(hint, auto),
        transport=str(transport),
        communicator=communicator,
        device=str(_get(hint, "_device")),
        static_shape=bool(_get(hint, "_static_shape")),
        direct_return=bool(_get(hint, "_direct_return")),
    )


def type_hint(node: Any) -> RayTypeHint | None:
    """A node's ``with_tensor_transport`` hint, or None when it has none."""
    return _type_hint(_get(node, "_type_hint"))


@dataclass(frozen=True)
class RayCollective:
    """A collective operation as Ray holds it."""

    key: int  # the same for every member of one operation
    kind: str  # "allreduce" | "allgather" | "reducescatter"
    reduce_op: str | None  # the ReduceOp's name (SUM, ...) or None (allgather)
    hint: RayTypeHint
    actors: list[Any]  # ClassNodes or handles, in rank order


def collective_kind(op: Any) -> str | None:
    """"allgather", "allreduce" or "reducescatter" for one of Ray's collective ops."""
    types = "ray.experimental.util.types"
    for name, kind in (
        ("AllGatherOp", "allgather"),
        ("AllReduceOp", "allreduce"),
        ("ReduceScatterOp", "reducescatter"),
    ):
        if isinstance(op, _import(types, name)):
            return kind
    return None


def reduce_op(op: Any) -> Any:
    """The ReduceOp of an allreduce or reducescatter op, else None."""
    return getattr(op, "reduceOp", None)


def collective_of(node: Any) -> RayCollective:
    """The operation a ``CollectiveOutputNode`` is a member of."""
    coll = _get(node, "_collective_op")
    op = _get(coll, "_op")
    kind = collective_kind(op)
    hint = _type_hint(_get(coll, "_type_hint"))
    if kind is None or hint is None:
        raise mismatch(f"collective operation {type(op).__name__}")
    red = reduce_op(op)
    return RayCollective(
        key=id(coll),
        kind=kind,
        reduce_op=red.name if red is not None else None,
        hint=hint,
        actors=list(_get(coll, "actor_handles")),
    )


def unbound_call(unbound: Any) -> tuple[Any, str, dict[str, Any]]:
    """(ClassNode, method name, options) of ``actor.method`` before ``.bind``."""
    return (
        _get(unbound, "_actor"),
        str(_get(unbound, "_method_name")),
        dict(_get(unbound, "_options") or {}),
    )


# ------------------------------------------------------------------------- building
def _constants() -> Any:
    try:
        return importlib.import_module("ray.dag.constants")
    except ImportError:
        raise mismatch("ray.dag.constants") from None


def new_output_placeholder(call: Any, index: int, actor: Any, *, collective: bool) -> Any:
    """Output ``index`` of a multi-return ``call`` on ClassNode ``actor``, shaped as Ray
    makes it for live handles (a ``CollectiveOutputNode`` for a collective's member)."""
    c = _constants()
    cls = (
        _import(_COLL, "CollectiveOutputNode")
        if collective
        else _import(_CLS, "ClassMethodNode")
    )
    return cls(
        f"return_idx_{index}",
        (call, index),
        {},
        {},
        {c.IS_CLASS_METHOD_OUTPUT_KEY: True, c.PARENT_CLASS_NODE_KEY: actor},
    )


def new_collective_operation(actors: list[Any], op: Any, transport: Any) -> Any:
    """Ray's collective operation over ClassNode ``actors`` (Ray builds one only for live
    handles), with the transport Ray's own ``_bind`` would give it."""
    operation = _import(_COLL, "_CollectiveOperation")
    tensor = _import(_TT, "TorchTensorType")
    coll = operation.__new__(operation)
    coll._actor_handles = actors  # ClassNodes stand in for handles here
    coll._op = op
    coll._type_hint = tensor(transport=transport or tensor.ACCELERATOR, _direct_return=True)
    return coll


def new_collective_member(method: str, args: tuple[Any, ...], actor: Any, coll: Any) -> Any:
    """One member of ``coll`` on ClassNode ``actor``, appended to the actor's chain of
    binds as a ``.bind`` on it would be."""
    c = _constants()
    member = _import(_COLL, "CollectiveOutputNode")(
        method,
        args,
        {},
        {},
        {
            c.PARENT_CLASS_NODE_KEY: actor,
            c.PREV_CLASS_METHOD_CALL_KEY: _get(actor, "_last_call"),
            c.COLLECTIVE_OPERATION_KEY: coll,
        },
    )
    actor._last_call = member
    return member
