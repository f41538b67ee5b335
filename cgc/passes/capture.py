"""Pass ``capture``: which COMPUTE ops each actor replays as a CUDA graph
(``Program.captured_ops``).

A call asks for capture when its method is marked ``@cgc.method(cuda_graph=True)`` or its
actor has the ``cuda_graph=True`` option (``Node.cuda_graph``, set by the frontend). Each
such call's COMPUTE op in the loop becomes a region of its own: the actor captures the
call once its inputs' shapes have been seen in warm-up and replays it per execution;
reads, writes, sends and receives stay outside (``cgc.runtime.gpu.cuda_graphs``). The prologue
(execution-0 copies of prefetch ops) is never captured.

Example: for ``s.forward`` marked on a one-actor chain, ``programs[0].captured_ops == [1]``
(``0R:c1 1C 2W:c2``: the COMPUTE is op 1).
"""

from __future__ import annotations

from cgc.passes.state import LowerState, require
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["assign_captures", "pre", "post"]

_NAME = "capture"


def assign_captures(state: LowerState) -> None:
    """Set ``captured_ops`` of every program from its calls' ``Node.cuda_graph``.

    Example: ``list(plan.lowered.programs[0].captured_ops) == [1]`` in the module's example.
    """
    nodes = state.plan.graph.nodes
    for prog in state.lowered.programs:
        prog.captured_ops.extend(i for i, op in enumerate(prog.ops)
                                 if op.kind == pb.COMPUTE and nodes[op.task].cuda_graph)


def pre(state: LowerState) -> None:
    require(len(state.lowered.programs) == len(state.plan.graph.actors), _NAME,
            "needs one program per actor (pass schedule first)")
    require(not any(p.captured_ops for p in state.lowered.programs), _NAME,
            "captures already assigned")


def post(state: LowerState) -> None:
    nodes = state.plan.graph.nodes
    for prog in state.lowered.programs:
        got = list(prog.captured_ops)
        require(got == sorted(set(got)), _NAME, f"{prog.actor}: captured ops not ascending")
        for i in got:
            op = prog.ops[i]
            require(op.kind == pb.COMPUTE and nodes[op.task].cuda_graph, _NAME,
                    f"{prog.actor}: op {i} is not a COMPUTE of a call marked for capture")
