"""``trace()``: a graph of builder (or Ray DAG) nodes -> ``pb.Graph``, with all checks.

Order is structural, so the same program always gives the same bytes: INPUT, then the used
input attributes (positional by index, then keywords by name), then calls and collective
members in a post-order walk from the outputs (each after its inputs and after the
previous call on its actor), then OUTPUT. Actors appear in the order of their first call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cgc.frontend import walk
from cgc.frontend.actor_proto import derive_names
from cgc.frontend.actors import declared_cuda_graph
from cgc.frontend.collectives import CollectiveNode, ReduceOp
from cgc.frontend.graph_checks import check_structure, split_output
from cgc.frontend.locations import LocRenderer, RawLoc
from cgc.frontend.node_checks import (
    actor_class,
    actor_options,
    check_ctor,
    check_method,
    encode_constant,
    hint_to_proto,
)
from cgc.frontend.nodes import (
    CallNode,
    DAGNode,
    HintSpec,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)
from cgc.frontend.ray_private import is_ray_dag_object
from cgc.frontend.reporter import Names
from cgc.frontend.weight_sync import SyncNode, sync_proto
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["TraceResult", "trace"]

_KINDS = {"allreduce": pb.ALLREDUCE, "allgather": pb.ALLGATHER, "reducescatter": pb.REDUCESCATTER}


@dataclass
class TraceResult:
    """What ``trace()`` gives: the graph and what an in-process runtime needs besides."""

    graph: pb.Graph
    needs_trust: bool = False
    live_handles: dict[str, Any] = field(default_factory=dict)  # actor name -> Ray handle
    classes: dict[str, type] = field(default_factory=dict)  # actor name -> class object


def trace(
    output: Any,
    *,
    allow_pickle: bool = False,
    model_file: str | os.PathLike[str] | None = None,
    model_module: ModuleType | None = None,
) -> TraceResult:
    """Trace a graph into ``pb.Graph`` and check it.

    ``output`` is a node, a ``MultiOutputNode``, or a Ray DAG node (``ray.dag``). Constants
    that are not plain data are refused unless ``allow_pickle`` (then ``needs_trust``).
    ``model_file``/``model_module``: the file the graph came from and the module loaded from
    it; its classes get their source embedded and source lines are relative to its folder.

    Example::

        with InputNode() as inp:
            dag = Worker.bind().fwd.bind(inp)
        graph = trace(dag).graph   # INPUT, worker.fwd#0, OUTPUT

    Raises:
        CompileError: the graph is invalid; the message names the node, Class.method and
            the source line, and says how to fix it.
    """
    if is_ray_dag_object(output) or (
        isinstance(output, MultiOutputNode) and any(is_ray_dag_object(o) for o in output.outputs)
    ):
        from cgc.frontend.ray_adapter import convert_output

        output = convert_output(output)
    outputs, multi, out_loc = split_output(output)
    return _Tracer(allow_pickle, model_file, model_module).run(outputs, multi, out_loc)


class _Tracer:
    def __init__(self, allow_pickle: bool, model_file: Any, model_module: Any) -> None:
        self.allow_pickle = allow_pickle
        self.model_file = model_file
        self.model_module = model_module
        self.renderer = LocRenderer(model_file)
        self.names = Names(self.renderer)
        self.needs_trust = False
        self.ids: dict[int, int] = {}

    # ------------------------------------------------------------------ structure
    def run(self, outputs: list[Any], multi: bool, out_loc: Any) -> TraceResult:
        got = walk.collect(outputs)
        order = walk.topo_order(outputs, got)
        cycle = order[0] if order and isinstance(order[0], list) else None
        calls = [
            n for n in (got.nodes if cycle else order) if isinstance(n, (CallNode, CollectiveNode))
        ]
        graph_ids = set(got.members)
        ours = {id(n) for n in got.nodes if isinstance(n, InputNode)}
        # Calls fed by another InputNode belong to another graph that shares an actor.
        extra = [
            e
            for e in walk.closure(graph_ids, got.nodes)
            if not isinstance(e, (CallNode, CollectiveNode)) or not walk.upstream_inputs(e) - ours
        ]
        actors = self._name_everything(calls, extra)
        check_structure(self.names, outputs, got, cycle, extra, out_loc)
        return self._emit(outputs, multi, out_loc, got, order, actors)

    def _name_everything(self, calls: list[Any], extra: list[Any]) -> list[Any]:
        """Assign actor names (graph actors first) and dense per-actor bind indexes."""
        actors: list[Any] = []
        seen: set[int] = set()
        for n in calls + [e for e in extra if isinstance(e, (CallNode, CollectiveNode))]:
            if id(n.actor) not in seen:
                seen.add(id(n.actor))
                actors.append(n.actor)
        names = derive_names([(a.options.get("name") or "", a._describe()) for a in actors])
        for a, name in zip(actors, names, strict=True):
            self.names.actor[id(a)] = name
        members = {id(n) for n in calls} | {id(e) for e in extra}
        for a in actors:
            mine = sorted((c for c in a._calls if id(c) in members), key=lambda c: c.bind_index)
            for i, c in enumerate(mine):
                self.names.bind_index[id(c)] = i
        graph_actor_ids = {id(n.actor) for n in calls}
        return [a for a in actors if id(a) in graph_actor_ids]

    # ------------------------------------------------------------------ emission
    def _emit(
        self,
        outputs: list[Any],
        multi: bool,
        out_loc: RawLoc,
        got: walk.Collected,
        order: list[Any],
        actors: list[Any],
    ) -> TraceResult:
        g = pb.Graph()
        result = TraceResult(graph=g)
        modules: dict[str, pb.EmbeddedModule] = {}
        for a in actors:
            g.actors.append(self._actor(a, modules))
            name = self.names.actor[id(a)]
            if a.cls is not None:
                result.classes[name] = a.cls
            if a.external is not None:
                result.live_handles[name] = a.external.handle
        g.modules.extend(modules[k] for k in sorted(modules))
        inp = next(n for n in got.nodes if isinstance(n, InputNode))
        attrs = [n for n in got.nodes if isinstance(n, InputAttributeNode)]
        attrs.sort(key=lambda n: (isinstance(n.key, str), n.key))
        self._node(g, inp, pb.INPUT)
        for a in attrs:
            node = self._node(g, a, pb.INPUT_ATTR)
            if isinstance(a.key, int):
                node.key_kind, node.index = pb.INDEX, a.key
            else:
                node.key_kind, node.field = pb.FIELD, a.key
        groups: list[Any] = []
        for n in order:
            if isinstance(n, CollectiveNode):
                if n.group not in groups:
                    groups.append(n.group)
            node = self._node(g, n, pb.CALL if isinstance(n, CallNode) else pb.COLLECTIVE)
            self._call(node, n)
        for cid, grp in enumerate(groups):
            self._collective(g, cid, grp)
        syncs = [n.sync for n in order if isinstance(n, SyncNode) and n is n.sync.send]
        for sid, sync in enumerate(syncs):
            g.weight_syncs.append(sync_proto(sync, sid, self.ids, self.names.actor,
                                             self.renderer.proto(sync.loc)))
        out = g.nodes.add(id=len(g.nodes), kind=pb.OUTPUT, name="output", multi_output=multi)
        out.loc.CopyFrom(self.renderer.proto(out_loc))
        for v in outputs:
            out.args.append(self._arg(None, v, "output"))
        ints = [a.key for a in attrs if isinstance(a.key, int)]
        g.num_positional = max(ints) + 1 if ints else 0
        g.keyword_fields.extend(sorted(a.key for a in attrs if isinstance(a.key, str)))
        used = list(outputs) + [v for n in order for v in walk.arg_values(n)]
        g.whole_input = any(v is inp for v in used)
        result.needs_trust = self.needs_trust
        return result

    def _node(self, g: pb.Graph, n: Any, kind: int) -> pb.Node:
        node = g.nodes.add(id=len(g.nodes), kind=kind, name=self.names.of(n))
        self.ids[id(n)] = node.id
        self.names.node[id(n)] = node.name
        node.loc.CopyFrom(self.renderer.proto(n._loc))
        num = n.num_returns if isinstance(n, (CallNode, CollectiveNode)) else 1
        self._hints(node, n, num, is_input=kind in (pb.INPUT, pb.INPUT_ATTR))
        return node

    def _hints(self, node: pb.Node, n: Any, num: int, *, is_input: bool) -> None:
        per: dict[int, tuple[HintSpec, int]] = {}
        whole = n._hints.get(None)
        if whole is not None:
            for i in range(num):
                per[i] = (whole, num)
        for i, h in n._hints.items():
            if i is not None:
                per[i] = (h, 1)
        for i in sorted(per):
            h, values = per[i]
            proto = hint_to_proto(
                self.names,
                n,
                h,
                is_input=is_input,
                num_values=values,
                loc_proto=self.renderer.proto(h.loc),
            )
            node.hints.add(output_index=i).hint.CopyFrom(proto)

    def _call(self, node: pb.Node, n: Any) -> None:
        node.actor = self.names.actor[id(n.actor)]
        node.method = n.method
        node.num_returns = n.num_returns
        node.bind_index = self.names.bind_index[id(n)]
        node.cuda_graph = bool(n.actor.options.get("cuda_graph")) or \
            declared_cuda_graph(n.actor.cls, n.method)
        if isinstance(n, CallNode) and not isinstance(n, SyncNode):
            check_method(self.names, n, n.actor.cls)
        for i, v in enumerate(n.args):
            node.args.append(self._arg(n, v, f"argument {i}"))
        for k in sorted(n.kwargs):
            node.kwargs.add(name=k).arg.CopyFrom(self._arg(n, n.kwargs[k], f"keyword {k!r}"))

    def _arg(self, consumer: Any, value: Any, path: str) -> pb.Arg:
        if isinstance(value, DAGNode):
            target, index = walk.ref_target(value)
            return pb.Arg(ref=pb.NodeRef(node=self.ids[id(target)], output_index=index))
        return pb.Arg(constant=self._const(consumer, value, path))

    def _const(self, consumer: Any, value: Any, path: str, actor: Any = None) -> pb.Value:
        encoded, pickled = encode_constant(
            self.names, consumer, value, path, allow_pickle=self.allow_pickle, actor=actor
        )
        self.needs_trust |= pickled
        return encoded

    def _collective(self, g: pb.Graph, cid: int, grp: Any) -> None:
        c = g.collectives.add(id=cid, kind=_KINDS[grp.kind], concat=grp.concat)
        if grp.op is not None:
            # cgc's ReduceOp is the plan's enum (cgc.plan_schema.collective)
            c.reduce_op = ReduceOp(grp.op).value
        for m in grp.members:
            c.nodes.append(self.ids[id(m)])
            g.nodes[self.ids[id(m)]].collective = cid
        loc = self.renderer.proto(grp.loc)
        c.loc.CopyFrom(loc)
        hint = HintSpec(transport=grp.transport or "nccl", loc=grp.loc)
        c.hint.CopyFrom(
            hint_to_proto(
                self.names, grp.members[0], hint, is_input=False, num_values=1, loc_proto=loc
            )
        )

    def _actor(self, a: Any, modules: dict[str, pb.EmbeddedModule]) -> pb.Actor:
        name = self.names.actor[id(a)]
        out = pb.Actor(name=name)
        out.loc.CopyFrom(self.renderer.proto(a._loc))
        if a.external is not None:
            out.cls.module, out.cls.qualname = a.class_module, a.class_qualname
            ext = a.external
            out.external.CopyFrom(
                pb.ExternalActor(name=ext.name, namespace=ext.namespace, actor_id=ext.actor_id)
            )
            if ext.placement is not None:
                from cgc.frontend.live_actors import placement_proto

                out.external.placement.CopyFrom(placement_proto(ext.placement))
            return out
        ref, embedded = actor_class(
            self.names, a, model_file=self.model_file, model_module=self.model_module
        )
        out.cls.CopyFrom(ref)
        self.needs_trust |= bool(ref.pickled_class)
        if embedded is not None:
            modules.setdefault(embedded.name, embedded)
        out.options.CopyFrom(actor_options(self.names, a))
        check_ctor(self.names, a)
        for i, v in enumerate(a.ctor_args):
            out.ctor_args.append(self._const(None, v, f"argument {i}", actor=a))
        for k in sorted(a.ctor_kwargs):
            out.ctor_kwargs.add(name=k).value.CopyFrom(
                self._const(None, a.ctor_kwargs[k], f"keyword {k!r}", actor=a)
            )
        return out
