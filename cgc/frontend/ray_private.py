"""Every use of Ray's internals by cgc's frontend, in one place.

Ray's DAG objects keep what the adapter needs (bound arguments, an actor's chain of calls,
type hints, a live handle's actor id) in private attributes, and ``record_ray_bind_sites()``
replaces a few of Ray's functions while a model is built. None of this is Ray's public API,
so it may change in any Ray release: the rest of the frontend reads Ray's objects only
through the functions here, and ``PRIVATE_API`` lists every use:

===========  ==========================================================================
use          meaning
===========  ==========================================================================
``READ``     an attribute read on Ray's objects (checked on sample objects)
``IMPORT``   a private module, class, function or constant that cgc imports or calls
``PATCH``    a function replaced while ``record_ray_bind_sites()`` is active
``WRITE``    an attribute cgc sets on Ray objects it builds itself
``MARK``     a dunder Ray sets on user classes and methods (read with a default, since
             cgc's and plain classes lack it; checked by behaviour in the test)
===========  ==========================================================================

Written for Ray ``WRITTEN_FOR``. ``require()`` (called before a Ray DAG is converted)
checks the module-level entries (those of Ray's collective modules once something has
imported them: they import torch, which a graph without collectives must not pay for); a missing instance attribute met later is reported the
same way: a ``RayVersionError`` naming the installed Ray version and the attribute,
never a bare ``AttributeError``. ``check_private_api()`` checks every entry, instance
attributes on sample objects included (``tests/frontend/test_ray_private.py`` runs it).

Importing this module does not import Ray.
"""

from __future__ import annotations

import enum
import functools
import importlib
import sys
from dataclasses import dataclass
from typing import Any

from cgc.errors import RayVersionError

__all__ = [
    "WRITTEN_FOR",
    "Use",
    "PrivateUse",
    "PRIVATE_API",
    "PatchTarget",
    "PATCH_NODE_INIT",
    "PATCH_TENSOR_TRANSPORT",
    "PATCH_CLASS_METHOD_BIND",
    "PATCH_COLLECTIVE_BIND",
    "TRACE_CTX_KWARG",
    "RayTypeHint",
    "RayCollective",
    "require",
    "check_private_api",
    "mismatch",
    "is_ray_dag_object",
]

# The Ray release (major.minor) whose internals this module was written against.
WRITTEN_FOR = "2.60"

# Ray's tracing wrapper adds this keyword to actor methods; users never pass it.
TRACE_CTX_KWARG = "_ray_trace_ctx"


class Use(enum.Enum):
    """How cgc touches one of Ray's internals."""

    READ = "read"
    IMPORT = "import"
    PATCH = "patch"
    WRITE = "write"
    MARK = "mark"


@dataclass(frozen=True)
class PrivateUse:
    """One internal of Ray that cgc uses: ``module`` then the dotted ``name`` inside it."""

    module: str
    name: str
    use: Use
    why: str

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"


_R, _I, _P, _W = Use.READ, Use.IMPORT, Use.PATCH, Use.WRITE
_DAG, _CLS, _INP = "ray.dag.dag_node", "ray.dag.class_node", "ray.dag.input_node"
_COLL, _TT = "ray.dag.collective_node", "ray.experimental.channel.torch_tensor_type"

PRIVATE_API: tuple[PrivateUse, ...] = (
    PrivateUse("ray.dag.py_obj_scanner", "_PyObjScanner", _I, "find the nodes among arguments"),
    PrivateUse(_DAG, "DAGNode._bound_args", _R, "a node's positional arguments"),
    PrivateUse(_DAG, "DAGNode._bound_kwargs", _R, "a node's keyword arguments"),
    PrivateUse(_DAG, "DAGNode._bound_other_args_to_resolve", _R, "links to parent nodes"),
    PrivateUse(_DAG, "DAGNode._downstream_nodes", _R, "consumers: find dangling calls"),
    PrivateUse(_DAG, "DAGNode._upstream_nodes", _R, "producers: Ray's checks, in its order"),
    PrivateUse(_DAG, "DAGNode._args_contain_nested_dag_node", _R,
               "Ray's own 'node in a container' flag (the drop-in rejects as Ray does)"),
    PrivateUse(_DAG, "DAGNode._bound_options", _R, "actor options, num_returns"),
    PrivateUse(_DAG, "DAGNode._type_hint", _R, "with_tensor_transport hints"),
    PrivateUse(_DAG, "DAGNode.__init__", _P, "note where each node is created"),
    PrivateUse(_DAG, "DAGNode.with_tensor_transport", _P, "note where a hint is given"),
    PrivateUse(_INP, "InputNode.input_attribute_nodes", _R, "inp[k] nodes made so far"),
    PrivateUse(_INP, "InputAttributeNode._dag_input_node", _R, "the InputNode of inp[k]"),
    PrivateUse(_INP, "InputAttributeNode.key", _R, "k of inp[k]"),
    PrivateUse(_CLS, "ClassNode._body", _R, "the @ray.remote class"),
    PrivateUse(_CLS, "ClassNode._last_call", _R, "the actor's chain of binds (bind order)"),
    PrivateUse(_CLS, "ClassNode._last_call", _W, "extend the chain with collective members"),
    PrivateUse(_CLS, "ClassMethodNode._parent_class_node", _R, "the actor a call runs on"),
    PrivateUse(_CLS, "ClassMethodNode._prev_class_method_call", _R, "the chain of binds"),
    PrivateUse(_CLS, "ClassMethodNode._bind_index", _R, "bind order on a live handle"),
    PrivateUse(_CLS, "ClassMethodNode.is_class_method_output", _R, "a multi-return output"),
    PrivateUse(_CLS, "ClassMethodNode.class_method_call", _R, "the call an output is of"),
    PrivateUse(_CLS, "ClassMethodNode.output_idx", _R, "which output of the call"),
    PrivateUse(_CLS, "ClassMethodNode.get_method_name", _R, "the method's name"),
    PrivateUse(_CLS, "ClassMethodNode", _I, "build multi-return placeholders (ClassNode)"),
    PrivateUse(_CLS, "_UnboundClassMethodNode._actor", _R, "the ClassNode of actor.m"),
    PrivateUse(_CLS, "_UnboundClassMethodNode._method_name", _R, "m of actor.m"),
    PrivateUse(_CLS, "_UnboundClassMethodNode._options", _R, "actor.m.options(...)"),
    PrivateUse(_CLS, "_UnboundClassMethodNode.bind", _P, "multi-return on ClassNodes"),
    PrivateUse("ray.dag.function_node", "FunctionNode._body", _R, "name it in the error"),
    PrivateUse("ray.dag.constants", "IS_CLASS_METHOD_OUTPUT_KEY", _I, "placeholder nodes"),
    PrivateUse("ray.dag.constants", "PARENT_CLASS_NODE_KEY", _I, "placeholder, member nodes"),
    PrivateUse("ray.dag.constants", "PREV_CLASS_METHOD_CALL_KEY", _I, "collective members"),
    PrivateUse("ray.dag.constants", "COLLECTIVE_OPERATION_KEY", _I, "collective members"),
    PrivateUse(_COLL, "CollectiveOutputNode", _I, "collectives among ClassNode actors"),
    PrivateUse(_COLL, "CollectiveOutputNode._collective_op", _R, "a member's operation"),
    PrivateUse(_COLL, "_CollectiveOperation", _I, "collectives among ClassNode actors"),
    PrivateUse(_COLL, "_CollectiveOperation._op", _R, "AllReduceOp / AllGatherOp / ..."),
    PrivateUse(_COLL, "_CollectiveOperation._op", _W, "collectives among ClassNode actors"),
    PrivateUse(_COLL, "_CollectiveOperation._type_hint", _R, "the collective's transport"),
    PrivateUse(_COLL, "_CollectiveOperation._type_hint", _W, "the collective's transport"),
    PrivateUse(_COLL, "_CollectiveOperation._actor_handles", _W, "its ClassNode actors"),
    PrivateUse(_COLL, "_CollectiveOperation.actor_handles", _R, "members' rank order"),
    PrivateUse("ray.experimental.collective.operations", "_bind", _P, "ClassNode members"),
    PrivateUse("ray.experimental.util.types", "AllGatherOp", _I, "the collective's kind"),
    PrivateUse("ray.experimental.util.types", "AllReduceOp", _I, "the collective's kind"),
    PrivateUse("ray.experimental.util.types", "ReduceScatterOp", _I, "the collective's kind"),
    PrivateUse("ray.experimental.util.types", "AllReduceOp.reduceOp", _R, "the reduce op"),
    PrivateUse(_TT, "TorchTensorType", _I, "hint kind; the transport of ClassNode members"),
    PrivateUse(_TT, "TorchTensorType.ACCELERATOR", _I, "default collective transport"),
    PrivateUse(_TT, "TorchTensorType.transport", _R, "the hint's transport"),
    PrivateUse(_TT, "TorchTensorType._communicator", _R, "a named communicator"),
    PrivateUse(_TT, "TorchTensorType._device", _R, "the hint's device"),
    PrivateUse(_TT, "TorchTensorType._static_shape", _R, "_static_shape=True"),
    PrivateUse(_TT, "TorchTensorType._direct_return", _R, "_direct_return=True"),
    PrivateUse("ray.experimental.channel.auto_transport_type", "AutoTransportType", _I,
               "the default hint"),
    PrivateUse("ray.actor", "ActorClass.__ray_metadata__", _R, "a @ray.remote class's data"),
    PrivateUse("ray.actor", "_ActorClassMetadata.modified_class", _R, "Ray's class wrapper"),
    PrivateUse("ray.actor", "__ray_actor_class__", Use.MARK, "the user class of the wrapper"),
    PrivateUse("ray.actor", "__ray_num_returns__", Use.MARK, "@ray.method(num_returns=k)"),
    PrivateUse("ray.actor", "ActorHandle._ray_actor_id", _R, "identify a live actor"),
    PrivateUse("ray.actor", "ActorHandle.__ray_call__", _R,
               "ask a live actor what it holds (resources, node, GPU ids)"),
    PrivateUse("ray.actor", "ActorHandle._ray_actor_creation_function_descriptor", _R,
               "a live actor's class"),
    PrivateUse("ray._raylet", "PythonFunctionDescriptor.module_name", _R, "its module"),
    PrivateUse("ray._raylet", "PythonFunctionDescriptor.class_name", _R, "its class"),
)
del _R, _I, _P, _W


@dataclass(frozen=True)
class PatchTarget:
    """A function of Ray replaced while bind sites are recorded: ``module.owner.attr``
    (``owner`` is "" for a module-level function)."""

    module: str
    owner: str
    attr: str


PATCH_NODE_INIT = PatchTarget(_DAG, "DAGNode", "__init__")
PATCH_TENSOR_TRANSPORT = PatchTarget(_DAG, "DAGNode", "with_tensor_transport")
PATCH_CLASS_METHOD_BIND = PatchTarget(_CLS, "_UnboundClassMethodNode", "bind")
PATCH_COLLECTIVE_BIND = PatchTarget("ray.experimental.collective.operations", "", "_bind")


# ------------------------------------------------------------------------- checking
def _ray_version() -> str:
    return str(getattr(sys.modules.get("ray"), "__version__", "(not imported)"))


def mismatch(what: str) -> RayVersionError:
    """The error for an internal of Ray that is missing or changed.

    >>> "Ray" in str(mismatch("ray.dag.dag_node.DAGNode._bound_args"))
    True

    Raises:
        Nothing; the caller raises what it returns.
    """
    return RayVersionError(
        f"the installed Ray {_ray_version()} has no {what}, which cgc's Ray DAG adapter "
        f"uses (it was written for Ray {WRITTEN_FOR}); install ray=={WRITTEN_FOR}.* or "
        "build the graph with cgc's builder API (cgc.actor, cgc.InputNode)"
    )


def _resolve(module: str, name: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


# Modules whose import is costly and that a graph without collectives never loads:
# ``ray.experimental.collective`` imports ``ray.util.collective``, which imports torch
# (1.4 s of a 2 s compile). Their entries are checked once the model file has loaded them
# (a graph with a Ray collective has); until then no object of theirs can be in the graph.
_DEFERRED_MODULES = ("ray.experimental.collective",)


def _deferred(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in _DEFERRED_MODULES)


def _problems_of(uses: tuple[PrivateUse, ...]) -> list[str]:
    problems = []
    for use in uses:
        if use.use is Use.MARK:
            continue
        name = use.name.rsplit(".", 1)[0] if use.use in (Use.READ, Use.WRITE) else use.name
        try:
            _resolve(use.module, name)
        except (ImportError, AttributeError):
            problems.append(use.module + "." + name)
    return problems


def _module_level_problems() -> list[str]:
    return sorted(set(_problems_of(PRIVATE_API)))


@functools.cache
def _problems_in(module: str) -> tuple[str, ...]:
    """The missing module-level entries of ``module`` (cached: Ray does not change
    while a process runs)."""
    return tuple(_problems_of(tuple(u for u in PRIVATE_API if u.module == module)))


def require() -> None:
    """Check that the installed Ray has every module, class, function and constant in
    ``PRIVATE_API`` (instance attributes are checked where they are read). Cached per
    module. Entries of Ray's collective modules are checked only once something has
    imported them (the model file does when its graph has a collective): importing them
    imports torch, which a graph without collectives must not pay for.

    Example::

        require()          # before a Ray DAG is converted

    Raises:
        RayVersionError: one is missing; the message names it and the Ray version.
    """
    modules = dict.fromkeys(u.module for u in PRIVATE_API)  # in order, once each
    missing = sorted({
        p
        for m in modules
        if m in sys.modules or not _deferred(m)
        for p in _problems_in(m)
    })
    if missing:
        raise mismatch(", ".join(missing))


def check_private_api(samples: list[Any]) -> list[str]:
    """Every entry of ``PRIVATE_API`` that the installed Ray lacks, one line each.

    Module-level entries are resolved by import; an instance attribute (``READ``) is
    looked up on each of ``samples`` that is an instance of its class, and reported
    when no sample is one (so a test sees a gap in its samples too).

    Example::

        problems = check_private_api([class_node, method_node, inp, live_handle])
        assert not problems, "\\n".join(problems)

    Raises:
        Nothing; problems are returned.
    """
    problems = [str(mismatch(p)) for p in _module_level_problems()]
    for use in PRIVATE_API:
        if use.use is not Use.READ:
            continue
        owner_name, attr = use.name.rsplit(".", 1)
        try:
            owner = _resolve(use.module, owner_name)
        except (ImportError, AttributeError):
            continue  # reported above
        if hasattr(owner, attr):
            continue  # defined on the class (method, property, class attribute)
        mine = [s for s in samples if isinstance(s, owner)]
        if not mine:
            problems.append(f"no sample {use.module}.{owner_name} to check .{attr} on")
        elif not all(hasattr(s, attr) for s in mine):
            problems.append(str(mismatch(use.path)))
    return problems


def _get(obj: Any, attr: str) -> Any:
    """``obj.attr`` for an attribute in ``PRIVATE_API``; a RayVersionError if it is gone."""
    try:
        return getattr(obj, attr)
    except AttributeError:
        kind = type(obj)
        raise mismatch(f"{kind.__module__}.{kind.__qualname__}.{attr}") from None


def _import(module: str, name: str) -> Any:
    try:
        return _resolve(module, name)
    except (ImportError, AttributeError):
        raise mismatch(f"{module}.{name}") from None


def patch_original(target: PatchTarget, module: Any) -> tuple[Any, Any]:
    """(owner, original function) of a patch target in the loaded ``module``.

    Example::

        owner, orig = patch_original(PATCH_NODE_INIT, sys.modules["ray.dag.dag_node"])

    Raises:
        RayVersionError: the module has no such function.
    """
    try:
        owner = getattr(module, target.owner) if target.owner else module
        # A class's own entry, never one inherited (restoring must not shadow a base's).
        orig = owner.__dict__[target.attr] if isinstance(owner, type) else getattr(
            owner, target.attr
        )
    except (AttributeError, KeyError):
        dotted = ".".join(p for p in (target.module, target.owner, target.attr) if p)
        raise mismatch(dotted) from None
    return owner, orig


# ------------------------------------------------------------------------- reading
def is_ray_dag_object(value: Any) -> bool:
    """True for Ray DAG nodes (``ray.dag`` types), without importing Ray.

    >>> is_ray_dag_object(3)
    False

    Raises:
        Nothing.
    """
    return type(value).__module__.startswith("ray.dag")


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


def original_class(body: Any) -> Any:
    """The user's class behind Ray's actor class wrapper (``body`` itself otherwise),
    from the ``__ray_actor_class__`` mark.

    >>> class Plain: ...
    >>> original_class(Plain) is Plain
    True
    """
    return getattr(body, "__ray_actor_class__", body)


def remote_class(obj: Any) -> Any:
    """The user's class behind a ``@ray.remote`` class, or ``obj`` when it is not one."""
    if not isinstance(obj, _import("ray.actor", "ActorClass")):
        return obj
    return original_class(_get(_get(obj, "__ray_metadata__"), "modified_class"))


def declared_num_returns(method: Any) -> Any:
    """``num_returns`` of ``@ray.method(num_returns=k)`` on ``method``, else None."""
    return getattr(method, "__ray_num_returns__", None)


def handle_id(handle: Any) -> str:
    """A live actor handle's actor id, in hex."""
    return str(_get(handle, "_ray_actor_id").hex())


def call_in_actor(handle: Any, fn: Any) -> Any:
    """``fn(actor_self)`` run inside the live actor (Ray's ``__ray_call__``, which Ray
    Compiled Graph uses for the same questions); an ObjectRef of its result."""
    return _get(handle, "__ray_call__").remote(fn)


def handle_class(handle: Any) -> tuple[str, str]:
    """(module, class name) of a live actor handle's class."""
    desc = _get(handle, "_ray_actor_creation_function_descriptor")
    return str(_get(desc, "module_name")), str(_get(desc, "class_name"))


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
