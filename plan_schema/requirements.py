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

__all__ = ["Requirement", "requirements", "imported_names"]


@dataclass(frozen=True)
class Requirement:
    """A top-level module the plan needs installed, and why (``imported by m.py``)."""

    module: str
    why: str


def imported_names(source: str, filename: str, package: str | None = None) -> set[str]:
    """Dotted module names ``source`` imports, read with ``ast`` (nothing runs); a source
    that does not parse (or holds a NUL, in it or its file name) gives none. Relative imports are resolved against ``package``, or
    left out when it is None.

    Example: ``imported_names("import a.b\\nfrom .c import d", "m.py", "pkg")`` →
    ``{"a.b", "pkg.c", "pkg.c.d"}``.
    """
    names: set[str] = set()
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and package is None:
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(p for p in [*parts, base] if p)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if base)
    return names


def _imports(source: str, filename: str) -> set[str]:
    """Top-level modules of the absolute imports of ``source``."""
    return {n.split(".")[0] for n in imported_names(source, filename) if n}


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
