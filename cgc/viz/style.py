"""What every view shares: actor colours, DOT quoting, and the names of actors and tasks."""

from __future__ import annotations

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.display import escape
from cgc.plan_schema.values import value_to_text

__all__ = ["PALETTE", "actor_tint", "quote", "class_name", "actor_title", "task_label"]

PALETTE = ("#dbe9f6", "#fde2c8", "#d9f0d3", "#f2d7ee", "#fff2b2", "#e0e0e0", "#cfe8e6", "#f6d2d2")


def actor_tint(i: int) -> str:
    """The background colour of the ``i``-th actor, the same in every view."""
    return PALETTE[i % len(PALETTE)]


def quote(text: str) -> str:
    """A DOT double-quoted string, each line of ``text`` escaped for display
    (``cgc.plan_schema.display``). Example: ``quote('a"b') == '"a\\\\"b"'``."""
    text = "\n".join(escape(line) for line in text.split("\n"))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def class_name(actor: pb.Actor) -> str:
    """The actor's class as Ray shows it: the last part of its qualified name."""
    return actor.cls.qualname.rsplit(".", 1)[-1] or "?"


def actor_title(actor: pb.Actor) -> str:
    """``"Class:actor"``, the way Ray's graph view names an actor. Example: ``"Stage:w1"``."""
    return f"{class_name(actor)}:{actor.name}"


def task_label(node: pb.Node, graph: pb.Graph, consts: bool = True) -> str:
    """A task's short name: ``"fwd #2"``, ``"allreduce #0"``, ``"input[1]"``, ``"output"``.

    With ``consts``, constant arguments follow on a second line (``\\n`` separated).
    """
    if node.kind == pb.INPUT:
        return "input"
    if node.kind == pb.INPUT_ATTR:
        return f"input[{node.index}]" if node.key_kind == pb.INDEX else f"input.{node.field}"
    if node.kind == pb.OUTPUT:
        return "output"
    if node.kind == pb.COLLECTIVE:
        coll = graph.collectives[node.collective] if node.collective < len(graph.collectives) else None
        op = pb.CollectiveKind.Name(coll.kind).lower() if coll else "collective"
        return f"{op} #{node.collective}"
    text = f"{node.method} #{node.bind_index}"
    if consts:
        values = [value_to_text(a.constant, 16) for a in node.args if a.HasField("constant")]
        values += [
            f"{k.name}={value_to_text(k.arg.constant, 16)}"
            for k in node.kwargs
            if k.arg.HasField("constant")
        ]
        if values:
            text += f"\n({', '.join(values)})"
    return text
