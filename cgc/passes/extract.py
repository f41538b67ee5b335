"""Pass ``extract``: which input attributes each actor takes out of the whole input.

An actor that reads the whole input (a host channel whose source is the INPUT node) gets
the INPUT_ATTR values it also needs from that value: pass ``channels`` gave their edges the
whole input's channel instead of a channel of their own. This pass writes the decision on
the actor's READ of that channel: ``Op.extract`` lists the INPUT_ATTR node ids, sorted,
each taken by its ``Node.key_kind``/``index``/``field``. The runtime applies the list and
decides nothing itself.

Example: with ``a.f(inp)`` and ``a.g(inp[0])`` on one actor, ``a``'s program starts with
``2R:c1{1}``: read the whole input on c1 and take ``inp[0]`` (node 1) out of it.
"""

from __future__ import annotations

from cgc.ir import attrs as A
from cgc.passes.state import LowerState, require
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["assign_extracts", "pre", "post"]

_NAME = "extract"


def _wanted(state: LowerState) -> dict[tuple[str, int], list[int]]:
    """(actor, whole-input channel) -> sorted INPUT_ATTR node ids taken out of it."""
    g = state.g
    out: dict[tuple[str, int], set[int]] = {}
    for src, dst, d in g.edges(data=True):
        cid = d[A.CHANNEL]
        if g.nodes[src][A.KIND] != pb.INPUT_ATTR or not cid:
            continue
        ch = state.lowered.channels[cid - 1]
        if ch.source.node != src:  # carried by another node's channel: the whole input's
            out.setdefault((g.nodes[dst][A.ACTOR], cid), set()).add(src)
    return {k: sorted(v) for k, v in out.items()}


def assign_extracts(state: LowerState) -> None:
    """Set ``Op.extract`` on every READ of a whole-input channel that needs it.

    Example: ``plan.lowered.programs[0].ops[0].extract == [1]`` in the module's example.
    """
    wanted = _wanted(state)
    for prog in state.lowered.programs:
        for op in prog.ops:
            if op.kind == pb.READ and (prog.actor, op.channel) in wanted:
                op.extract.extend(wanted[(prog.actor, op.channel)])


def pre(state: LowerState) -> None:
    require(
        len(state.lowered.programs) == len(state.g.graph[A.GRAPH].actors),
        _NAME,
        "programs must exist before extract",
    )
    require(
        not any(op.extract for p in state.lowered.programs for op in p.ops),
        _NAME,
        "extracts already assigned",
    )


def post(state: LowerState) -> None:
    low, graph = state.lowered, state.g.graph[A.GRAPH]
    got = {
        (p.actor, op.channel): list(op.extract)
        for p in low.programs
        for op in p.ops
        if op.kind == pb.READ and op.extract
    }
    require(got == _wanted(state), _NAME, "an actor's READ lacks an extract it needs")
    for (_actor, cid), ids in got.items():
        require(
            graph.nodes[low.channels[cid - 1].source.node].kind == pb.INPUT,
            _NAME,
            f"extract on c{cid}, which does not carry the whole input",
        )
        require(
            all(graph.nodes[i].kind == pb.INPUT_ATTR for i in ids), _NAME, "extract of a non-input"
        )
