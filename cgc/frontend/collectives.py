"""Collective operations among actors: ``allreduce``, ``allgather``, ``reducescatter``.

Named like Ray's ``ray.experimental.collective``: ``allreduce.bind([a, b], op=ReduceOp.SUM)``
takes one node per actor (rank order = list order) and returns one ``CollectiveNode`` per
member, each a node on that member's actor. ``allreduce`` also takes a list of such lists
(one bucket per list, same actors in the same order); then, as in Ray, it returns one list
per member holding one result per bucket (each bucket is a collective of its own).
"""

from __future__ import annotations

from typing import Any

from cgc.errors import CompileError
from cgc.frontend.locations import RawLoc, capture_loc
from cgc.frontend.nodes import CallNode, DAGNode, OutputRef
from cgc.plan_schema.collective import ReduceOp  # the plan's own enum: no table to map it

__all__ = [
    "ReduceOp",
    "allreduce",
    "allgather",
    "reducescatter",
    "CollectiveGroup",
    "CollectiveNode",
]


class CollectiveGroup:
    """One collective operation: its kind, reduce op, members (rank order) and hint."""

    def __init__(
        self,
        kind: str,
        op: ReduceOp | None,
        transport: Any,
        loc: RawLoc,
        inputs: list[list[Any]],
        concat: bool = False,
    ) -> None:
        self.kind = kind  # "allreduce" | "allgather" | "reducescatter"
        self.concat = concat  # allgather: one value, the members' concatenated (Ray's)
        self.op = op
        self.transport = transport
        self.loc = loc
        self.inputs = inputs  # inputs[bucket][rank]
        self.members: list[CollectiveNode] = []


class CollectiveNode(DAGNode):
    """Member ``rank`` of a collective: the result on that member's actor."""

    def __init__(self, group: CollectiveGroup, rank: int, actor: Any, inputs: list[Any]) -> None:
        super().__init__(group.loc)
        self.group = group
        self.rank = rank
        self.actor = actor
        self.method = group.kind
        self.args = tuple(inputs)
        self.kwargs: dict[str, Any] = {}
        self.num_returns = len(inputs)
        self.bind_index = actor._register_call(self)
        self._link_upstream(self.args)

    def __getitem__(self, index: int) -> OutputRef:
        if not isinstance(index, int) or not 0 <= index < self.num_returns:
            raise IndexError(f"{self._describe()} has {self.num_returns} output(s)")
        return OutputRef(self, index, capture_loc())

    def __iter__(self):
        loc = capture_loc()
        return iter([OutputRef(self, i, loc) for i in range(self.num_returns)])

    def _describe(self) -> str:
        return f"{self.actor._describe()}.{self.method}#{self.bind_index}"


def member_actor(node: Any) -> Any:
    """The actor a collective input runs on, or None when it is not an actor's result."""
    if isinstance(node, OutputRef):
        node = node.call
    if isinstance(node, (CallNode, CollectiveNode)):
        return node.actor
    return None


def _fail(loc: RawLoc, kind: str, problem: str, fix: str) -> CompileError:
    return CompileError(
        f"{loc.short()}: {kind}.bind: {problem}; {fix}", method=kind, loc=loc.short()
    )


def bind_collective(
    kind: str, inputs: Any, op: ReduceOp | None, transport: Any, loc: RawLoc
) -> list[Any]:
    """Validate the member lists and make one ``CollectiveNode`` per member."""
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise _fail(
            loc,
            kind,
            "expected a non-empty list of nodes, one per actor",
            f"write {kind}.bind([w0_out, w1_out])",
        )
    nested = isinstance(inputs[0], (list, tuple))
    if nested and kind != "allreduce":
        raise _fail(
            loc,
            kind,
            "a list of lists (buckets) is only supported for allreduce",
            f"call {kind}.bind once per list",
        )
    buckets = [list(b) for b in inputs] if nested else [list(inputs)]
    # Ray's adapter hands in member inputs that are already cgc nodes (converted).
    actors: list[Any] | None = None
    for b, bucket in enumerate(buckets):
        where = f" (list {b})" if nested else ""
        if not bucket:
            raise _fail(loc, kind, f"empty input list{where}", "give one node per actor")
        row = []
        for x in bucket:
            a = member_actor(x)
            if a is None:
                raise _fail(
                    loc,
                    kind,
                    f"{x!r}{where} is not an actor method's result",
                    "pass the outputs of actor method calls, one per actor",
                )
            row.append(a)
        if len({id(a) for a in row}) != len(row):
            dup = next(a for a in row if sum(r is a for r in row) > 1)
            raise _fail(
                loc,
                kind,
                f"actor {dup._describe()} appears more than once{where}",
                "give exactly one input per actor (no duplicate actors)",
            )
        if len({id(x) for x in bucket}) != len(bucket):
            raise _fail(loc, kind, f"the same node is given twice{where}", "give distinct nodes")
        if actors is None:
            actors = row
        elif [id(a) for a in row] != [id(a) for a in actors]:
            raise _fail(
                loc,
                kind,
                f"list {b} has other actors or another order than list 0",
                "list the same actors in the same order in every bucket",
            )
    assert actors is not None
    # One collective per bucket. Ray flattens the buckets into one allreduce; every element
    # is still reduced over the same members, so the values are the same.
    groups = [CollectiveGroup(kind, op, transport, loc, [bucket]) for bucket in buckets]
    for group, bucket in zip(groups, buckets, strict=True):
        for rank, a in enumerate(actors):
            group.members.append(CollectiveNode(group, rank, a, [bucket[rank]]))
    if nested:  # like Ray: out[rank][bucket], one result per bucket on each member
        return [[g.members[rank] for g in groups] for rank in range(len(actors))]
    return list(groups[0].members)


class _Collective:
    def __init__(self, kind: str) -> None:
        self._kind = kind

    def __repr__(self) -> str:
        return f"cgc.{self._kind}"


class _AllReduce(_Collective):
    def bind(
        self, input_nodes: list[Any], op: ReduceOp = ReduceOp.SUM, transport: Any = None
    ) -> list[Any]:
        """One allreduce among the actors of ``input_nodes`` (one node per actor).

        Example: ``a0, a1 = allreduce.bind([w0.grad.bind(inp), w1.grad.bind(inp)])``.

        Raises:
            CompileError: an empty list, a node that is no actor's result, or the same
                actor twice.
        """
        return bind_collective("allreduce", input_nodes, _reduce_op(op), transport, capture_loc())


class _AllGather(_Collective):
    def bind(self, input_nodes: list[Any], transport: Any = None) -> list[Any]:
        """One allgather among the actors of ``input_nodes`` (one node per actor).

        Example: ``g0, g1 = allgather.bind([a, b])``.

        Raises:
            CompileError: as for ``allreduce.bind``.
        """
        return bind_collective("allgather", input_nodes, None, transport, capture_loc())


class _ReduceScatter(_Collective):
    def bind(
        self, input_nodes: list[Any], op: ReduceOp = ReduceOp.SUM, transport: Any = None
    ) -> list[Any]:
        """One reduce-scatter among the actors of ``input_nodes`` (one node per actor).

        Example: ``r0, r1 = reducescatter.bind([a, b], op=ReduceOp.MAX)``.

        Raises:
            CompileError: as for ``allreduce.bind``.
        """
        return bind_collective(
            "reducescatter", input_nodes, _reduce_op(op), transport, capture_loc()
        )


def _reduce_op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", None)  # Ray's ReduceOp enum has the same member names
    if isinstance(name, str) and name in ReduceOp.__members__:
        return ReduceOp[name]
    raise TypeError(f"op must be a ReduceOp (SUM, PRODUCT, MAX, MIN, AVG), got {op!r}")


allreduce = _AllReduce("allreduce")
allgather = _AllGather("allgather")
reducescatter = _ReduceScatter("reducescatter")
