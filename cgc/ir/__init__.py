"""The compiler's working graph: named attribute keys and ``pb.Graph`` -> networkx."""

from __future__ import annotations

from cgc.ir import attrs
from cgc.ir.graph import build_graph, node_label, task_order

__all__ = ["attrs", "build_graph", "node_label", "task_order"]
