"""The Ray DAG adapter: Ray's own DAG objects -> cgc builder nodes (then traced as usual).

Handles ``ray.dag.InputNode``/``InputAttributeNode``/``MultiOutputNode``, ``ClassNode`` (a
``@ray.remote`` class's ``.bind()``, with its options), ``ClassMethodNode`` (multi-return
placeholders included), collective output nodes and ``with_tensor_transport`` type hints.
Calls on live actor handles (``Actor.remote()``) become external actors: the plan refers to
the existing actor and ``TraceResult.live_handles`` carries the handle. What each live actor
holds (its resources, node and GPU ids) is read from it in one batched round once the DAG
is converted (``live_actors``), so a live GPU actor is a GPU actor in the plan.

Ray's hints keep Ray's meaning: ``with_tensor_transport()``/``"auto"`` lets the compiler
choose (NCCL between GPU actors, host memory otherwise; the runtime binds NCCL, CUDA IPC
or the CPU communicator from where they are), ``"nccl"``/``"accelerator"`` is NCCL,
``"shm"`` (and ``TorchTensorType``'s ``"auto"``/``"cpu"`` transports) host memory, with
``_static_shape``/``_direct_return`` dropped there since Ray gives them no effect on it.

Ray is imported only here, and only when a Ray object is traced. Ray's private attributes
are read only through ``ray_private``; a Ray release without them gives a
``RayVersionError`` naming the version, not an ``AttributeError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
import warnings
from typing import Any

from cgc.errors import CompileError, UnsupportedNodeError
from cgc.frontend import ray_private as rp
from cgc.frontend.actors import ACTOR_OPTIONS, ExternalSpec, LazyActor
from cgc.frontend.collectives import CollectiveGroup, CollectiveNode, ReduceOp
from cgc.frontend.locations import UNKNOWN_LOC, RawLoc
from cgc.frontend.nodes import CallNode, HintSpec, InputNode, MultiOutputNode, OutputRef
from cgc.frontend.ray_graph import ray_num_returns
from cgc.frontend.ray_private import is_ray_dag_object
from cgc.frontend.ray_sites import HINT_SITES, NODE_SITES

__all__ = ["convert_output", "is_ray_dag_object", "class_node_actor", "LiveActors"]

# Ray actor options that do not change what the graph computes; dropped without a word.
_IGNORED_OPTIONS = {
    "max_restarts",
    "max_task_retries",
    "max_pending_calls",
    "enable_task_events",
    "lifetime",
    "get_if_exists",
    "allow_out_of_order_execution",
    "concurrency_groups",
    "_metadata",
    "object_store_memory",
    "enable_tensor_transport",  # RDT on for the actor: cgc's plan sets each edge itself
}


def _site(node: Any) -> RawLoc:
    try:
        return NODE_SITES.get(node, UNKNOWN_LOC)
    except TypeError:
        return UNKNOWN_LOC


# Ray's TorchTensorType transports -> cgc's: "auto" and "cpu" in a tensor hint mean host
# memory (Ray's SharedMemoryType; only AutoTransportType chooses), "accelerator" is NCCL.
_TRANSPORTS = {"accelerator": "nccl", "auto": "shm", "cpu": "shm"}


def _transport(hint: rp.RayTypeHint, collective: bool = False) -> Any:
    if hint.auto:
        return "auto"
    if hint.communicator is not None:
        # A Ray Communicator object cannot live in a plan. A collective on one runs on the
        # communicator cgc binds among the same actors at start (NCCL between GPUs, else
        # the CPU communicator); a point-to-point edge on a CPU communicator (transport
        # "cpu", e.g. Ray's CPUCommunicator) moves host tensors: host memory does that.
        if collective or hint.transport != "cpu":
            return "nccl"
        return "shm"
    return _TRANSPORTS.get(hint.transport, hint.transport)


def _neighbors(node: Any, dag: Any) -> list[Any]:
    """Ray nodes linked to ``node``: arguments, consumers, the actor's chain, attributes."""
    found = rp.scan_nodes([rp.bound_args(node), rp.bound_kwargs(node), rp.other_args(node)])
    found.extend(rp.downstream(node))
    if isinstance(node, dag.InputNode):
        found.extend(rp.input_attributes(node))
    return found


class _Converter:
    """Converts one Ray DAG; also the table of live actors a traced step calls."""

    def __init__(self) -> None:
        import ray.dag as dag

        self.dag = dag
        self.memo: dict[int, Any] = {}
        self.keep: list[Any] = []  # keep Ray nodes alive while ids are in memo
        self.actors: dict[Any, LazyActor] = {}
        self.groups: dict[tuple[int, int], CollectiveGroup] = {}  # (operation, bucket)
        self.chain_pos: dict[int, int] = {}
        self.first_use: dict[str, RawLoc] = {}  # live actor id -> its first call's line

    # -------------------------------------------------------------- closure, order
    def run(self, output: Any) -> Any:
        order = self._order(output)
        for n in order:
            self.memo[id(n)] = self._convert(n)
        for grp in self.groups.values():
            grp.members.sort(key=lambda m: m.rank)
        return self.memo[id(output)]

    def _order(self, output: Any) -> list[Any]:
        """Every Ray node connected to ``output``, arguments before their consumers."""
        seen: dict[int, Any] = {}
        queue = [output]
        while queue:
            n = queue.pop()
            if id(n) in seen:
                continue
            seen[id(n)] = n
            queue.extend(m for m in _neighbors(n, self.dag) if id(m) not in seen)
        self.keep.extend(seen.values())
        order: list[Any] = []
        done: set[int] = set()
        for root in seen.values():
            stack = [(root, False)]
            while stack:
                n, expanded = stack.pop()
                if id(n) in done:
                    continue
                if expanded:
                    done.add(id(n))
                    order.append(n)
                    continue
                stack.append((n, True))
                stack.extend((m, False) for m in self._upstream(n) if id(m) not in done)
        return order

    def _upstream(self, n: Any) -> list[Any]:
        ups = rp.scan_nodes([rp.bound_args(n), rp.bound_kwargs(n)])
        if isinstance(n, self.dag.InputAttributeNode):
            ups.append(rp.attribute_source(n)[0])
        if isinstance(n, self.dag.ClassMethodNode):
            parent = rp.parent_actor(n)
            if isinstance(parent, self.dag.ClassNode):
                ups.append(parent)
        return [u for u in ups if isinstance(u, self.dag.DAGNode)]

    # -------------------------------------------------------------- conversion
    def _value(self, v: Any) -> Any:
        if isinstance(v, self.dag.DAGNode):
            return self.memo[id(v)]
        if type(v) in (list, tuple):
            return type(v)(self._value(x) for x in v)
        if type(v) is dict:
            return {k: self._value(x) for k, x in v.items()}
        return v

    def _convert(self, n: Any) -> Any:
        dag = self.dag
        loc = _site(n)
        out: Any
        if isinstance(n, dag.InputNode):
            out = InputNode()
        elif isinstance(n, dag.InputAttributeNode):
            inp, key = rp.attribute_source(n)
            out = self.memo[id(inp)]._attr(key, loc)
        elif isinstance(n, dag.MultiOutputNode):
            out = MultiOutputNode([self._value(v) for v in rp.bound_args(n)])
        elif isinstance(n, dag.ClassNode):
            out = self._actor(n, loc)
        elif isinstance(n, dag.ClassMethodNode):
            out = self._method_node(n, loc)
        elif isinstance(n, dag.FunctionNode):
            # A NotImplementedError too, as in Ray Compiled Graph.
            raise UnsupportedNodeError(
                f"{loc.short()}: {rp.actor_body(n).__name__}: only actor method calls can "
                "be compiled, and this is a Ray remote function (FunctionNode); make the "
                "function a method of an actor",
                loc=loc.short(),
            )
        else:
            raise CompileError(
                f"{loc.short()}: unsupported Ray DAG node {type(n).__name__}; "
                "graphs are built from InputNode, actor method binds and "
                "MultiOutputNode",
                loc=loc.short(),
            )
        out._loc = loc
        self._hint(n, out)
        return out

    def _actor(self, n: Any, loc: RawLoc) -> LazyActor:
        actor = class_node_actor(n, loc, self._value)
        # Per-actor bind order: Ray chains a ClassNode's calls through prev-call links.
        chain = rp.call_chain(n)
        for pos, call in enumerate(chain):
            self.chain_pos[id(call)] = pos
        self.keep.extend(chain)
        return actor

    def handle_actor(self, handle: Any) -> LazyActor:
        """The (one) external actor for a live handle."""
        key = rp.handle_id(handle)
        if key not in self.actors:
            module, qualname = rp.handle_class(handle)
            name, namespace = _named(handle)
            cls = _import_class(module, qualname)
            self.actors[key] = LazyActor(
                cls,
                (),
                {},
                {},
                UNKNOWN_LOC,
                external=ExternalSpec(handle, key, name, namespace),
                class_module=module,
                class_qualname=qualname,
            )
        return self.actors[key]

    def _method_node(self, n: Any, loc: RawLoc) -> Any:
        placeholder = rp.output_of(n)
        if placeholder is not None:
            call, index = placeholder
            target = self.memo[id(call)]
            if isinstance(target, _Buckets):  # a bucketed allreduce: one member per bucket
                return target.members[index]
            return OutputRef(target, index, loc)
        parent = rp.parent_actor(n)
        if isinstance(parent, self.dag.ClassNode):
            actor = self.memo[id(parent)]
            position = self.chain_pos.get(id(n), 0)
        else:
            actor = self.handle_actor(parent)
            self.first_use.setdefault(rp.handle_id(parent), loc)
            position = rp.live_bind_index(n)
        args = [self._value(a) for a in rp.bound_args(n)]
        if isinstance(n, self.dag.CollectiveOutputNode):
            members = self._member(n, actor, args, loc)
            for m in members:
                m.bind_index = position
            return members[0] if len(members) == 1 else _Buckets(members)
        kwargs = {k: self._value(v) for k, v in rp.bound_kwargs(n).items()}
        method = rp.method_name(n)
        num = ray_num_returns(actor.cls, method, rp.bound_options(n))
        node = CallNode(actor, method, tuple(args), kwargs, num, loc)
        node.bind_index = position
        return node

    def observe_live(self) -> None:
        """Read what every live actor holds, in one batched round (``live_actors``)."""
        from cgc.frontend.live_actors import observe

        keys = sorted(self.actors)
        actors = [self.actors[k] for k in keys]
        specs = [a.external for a in actors if a.external is not None]  # all live
        held = observe(
            [spec.handle for spec in specs],
            [a._describe() for a in actors],
            [loc.short() if (loc := self.first_use.get(k, UNKNOWN_LOC)).file else ""
             for k in keys],
        )
        for a, spec, placement in zip(actors, specs, held, strict=True):
            a.external = dataclasses.replace(spec, placement=placement)

    def _member(
        self, n: Any, actor: LazyActor, args: list[Any], loc: RawLoc
    ) -> list[CollectiveNode]:
        """This actor's member of each bucket of a collective (one bucket but for a
        bucketed allreduce, which becomes one collective per bucket: Ray flattens the
        buckets into one allreduce, and every element is reduced over the same members)."""
        op = rp.collective_of(n)
        parent = rp.parent_actor(n)
        rank = next(i for i, h in enumerate(op.actors) if h is parent or h == parent)
        red = ReduceOp[op.reduce_op] if op.reduce_op else None
        members = []
        for bucket, arg in enumerate(args):
            grp = self.groups.get((op.key, bucket))
            if grp is None:
                # Ray's allgather returns one tensor, the members' concatenated along
                # dim 0 (cgc.allgather returns the list): the plan asks for Ray's.
                grp = CollectiveGroup(op.kind, red, _transport(op.hint, collective=True),
                                      loc, [], concat=op.kind == "allgather")
                self.groups[(op.key, bucket)] = grp
            member = CollectiveNode(grp, rank, actor, [arg])
            grp.members.append(member)
            members.append(member)
        return members

    def _hint(self, n: Any, out: Any) -> None:
        spec = _hint_spec(n)
        if spec is None or isinstance(out, (MultiOutputNode, LazyActor, _Buckets)):
            return
        spec.loc = HINT_SITES.get(n, out._loc)
        out._set_hint(spec)


def class_node_actor(n: Any, loc: RawLoc, value: Any = lambda v: v) -> LazyActor:
    """The lazy actor a Ray ``ClassNode`` (``Cls.bind(...)``) stands for: its class,
    constructor arguments (each passed through ``value``) and the options a plan keeps.

    Example: ``class_node_actor(Worker.bind(1), loc).ctor_args == (1,)``.

    Raises:
        RayVersionError: Ray keeps a ClassNode's parts elsewhere.
    """
    options = {}
    for key, v in rp.bound_options(n).items():
        if key in ACTOR_OPTIONS:
            options[key] = v
        elif key not in _IGNORED_OPTIONS and v is not None:
            warnings.warn(
                f"{loc.short()}: the Ray actor option {key}={v!r} is not kept "
                "in cgc plans and is ignored",
                stacklevel=3,
            )
    cls = rp.original_class(rp.actor_body(n))
    args = tuple(value(a) for a in rp.bound_args(n))
    kwargs = {k: value(v) for k, v in rp.bound_kwargs(n).items()}
    return LazyActor(cls, args, kwargs, options, loc)


class _Buckets:
    """A member of a bucketed allreduce, as converted: its result per bucket (Ray's output
    placeholders ``return_idx_i`` pick one)."""

    def __init__(self, members: list[CollectiveNode]) -> None:
        self.members = members
        self._loc = UNKNOWN_LOC


def _hint_spec(n: Any) -> HintSpec | None:
    """A cgc HintSpec for a Ray node's type hint (None when it has none)."""
    hint = rp.type_hint(n)
    if hint is None:
        return None
    transport = _transport(hint)
    # Ray gives a host-memory tensor hint's static-shape and direct-return flags no effect
    # (TorchTensorType logs so); cgc would enforce them, so they are not carried.
    on_host = transport == "shm"
    return HintSpec(
        transport=transport,
        device=hint.device,
        static_shape=hint.static_shape and not on_host,
        direct_return=hint.direct_return and not on_host,
    )


def _named(handle: Any) -> tuple[str, str]:
    """(name, namespace) of a named live actor, ("", "") otherwise."""
    try:
        import ray

        for entry in ray.util.list_named_actors(all_namespaces=True):
            h = ray.get_actor(entry["name"], namespace=entry["namespace"])
            if rp.handle_id(h) == rp.handle_id(handle):
                return entry["name"], entry["namespace"]
    except Exception:  # state lookups are best effort: the actor id is what binds it
        pass
    return "", ""


def _is_running_script(module: str) -> bool:
    """Whether importing ``module`` would run the script this process runs as ``__main__``
    (Ray names a script's classes by the script's file name: ``prog`` for prog.py)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file or module in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin: str | None = getattr(spec, "origin", None)
    return origin is not None and os.path.realpath(origin) == os.path.realpath(main_file)


def _import_class(module: str, qualname: str) -> Any:
    if _is_running_script(module):
        # Importing it would run the script's top level a second time; its classes are
        # in __main__ under the same names.
        module = "__main__"
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # an unimportable class only loses the signature checks
        return None
    obj = rp.remote_class(obj)
    return obj if isinstance(obj, type) else None


def convert_output(output: Any) -> Any:
    """Convert a Ray DAG (or a cgc MultiOutputNode of Ray nodes) to cgc builder nodes.

    Example: ``trace(convert_output(ray_dag))`` is what ``trace(ray_dag)`` does.

    Raises:
        UnsupportedNodeError: a Ray remote function (a ``NotImplementedError`` too).
        CompileError: other node kinds a plan cannot hold; a live actor that is dead or
            does not say what it holds (``live_actors.observe``).
        RayVersionError: the installed Ray lacks an internal the adapter reads (the
            message names it and the Ray version).
    """
    rp.require()
    conv = _Converter()
    if isinstance(output, MultiOutputNode):  # cgc's MultiOutputNode over Ray nodes
        out: Any = MultiOutputNode(
            [conv.run(o) if is_ray_dag_object(o) else o for o in output.outputs]
        )
    else:
        out = conv.run(output)
    conv.observe_live()
    return out


def LiveActors() -> Any:  # noqa: N802 - a constructor of the converter's live-actor table
    """A table of live actors: ``.handle_actor(h)`` gives the one external ``LazyActor``
    per handle, ``.first_use[id]`` the line of its first call, ``.observe_live()`` reads
    what each holds (one batched round). Used by the step tracer, as by the adapter.

    Raises:
        Nothing.
    """
    return _Converter()
