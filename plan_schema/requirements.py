"""What a plan needs installed where it runs, read from the plan alone (nothing runs).

A plan carries its model file (and the local modules it imports) as source, and names
other classes by module. What it does not carry must be installed on the driver and
every node: the modules of actor classes it names but does not embed, and the top-level
modules its embedded sources import. The standard library is left out, and so are the
modules the plan carries. Classes carried pickled may import more than can be seen.

Example::

    >>> from cgc.plan_schema import plan_pb2 as pb
    >>> p = pb.Plan()
    >>> _ = p.graph.modules.add(name="cgcmodel_m", source="import numpy\\nimport helpers\\n",
    ...                         source_file="m.py")
    >>> _ = p.graph.modules.add(name="helpers", source="import os\\n", source_file="helpers.py")
    >>> [(r.module, r.why) for r in requirements(p)]
    [('numpy', 'imported by m.py')]
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass

from cgc.plan_schema import plan_pb2 as pb

__all__ = ["Requirement", "requirements"]


@dataclass(frozen=True)
class Requirement:
    """A top-level module the plan needs installed, and why (``imported by m.py``)."""

    module: str
    why: str


def _imports(source: str, filename: str) -> set[str]:
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def requirements(plan: pb.Plan) -> list[Requirement]:
    """The modules ``plan`` needs installed, sorted by name (see the module docstring).

    Raises:
        Nothing: a source that does not parse simply adds nothing.
    """
    carried = {m.name.split(".")[0] for m in plan.graph.modules}
    skip = carried | set(sys.stdlib_module_names) | {"__main__", "__future__"}
    why: dict[str, list[str]] = {}
    for actor in plan.graph.actors:
        top = actor.cls.module.split(".")[0]
        if top and top not in skip and not actor.cls.pickled_class:
            why.setdefault(top, []).append(f"class of actor {actor.name}")
    for m in plan.graph.modules:
        for top in sorted(_imports(m.source, m.source_file or m.name) - skip):
            why.setdefault(top, []).append(f"imported by {m.source_file or m.name}")
    return [Requirement(name, ", ".join(dict.fromkeys(why[name]))) for name in sorted(why)]
