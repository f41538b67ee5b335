"""One-line text of an op for runtime messages (hang reports, timeouts).

Example: ``op_text(op, plan) == "3R:c1 (w1.fwd#0)"``.
"""

from __future__ import annotations

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["op_text"]


def op_text(op: pb.Op, plan: pb.Plan | None = None) -> str:
    """The op's token (``cgc.plan_schema.text``) plus the task's node name when known."""
    try:
        from cgc.plan_schema.text import format_op

        tok = format_op(op)
    except Exception:  # noqa: BLE001 - a message must never fail on formatting
        tok = f"{pb.OpKind.Name(op.kind)} task {op.task} channel {op.channel}"
    if plan is not None and op.task < len(plan.graph.nodes):
        tok += f" ({plan.graph.nodes[op.task].name})"
    return tok
