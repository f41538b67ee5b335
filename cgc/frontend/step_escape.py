"""Finding refs that escape a traced step: kept in a global, a closure or the step's object.

A ref kept so is a value the next execution would read from the last one: the graph
cannot hold that, so the trace fails naming the place and the line the ref was made.
A ref that escapes elsewhere (an object the step was given) is caught when it is used:
its trace is over, and any use raises ``EscapedRefError``.

Example: ``CACHE.append(w.fwd.remote(x))`` in a step fails with
``prog.py:8: the ref of Worker.fwd (made at prog.py:8) escapes the step into the global
CACHE ...``.
"""

from __future__ import annotations

import itertools
from typing import Any

from cgc.errors import EscapedRefError
from cgc.frontend.step_refs import StepState, TracedRef

__all__ = ["check_escapes"]

# Items looked at per container (a ref kept further in is caught when it is used later).
_MAX_ITEMS = 10_000


def _refs_in(value: Any, state: StepState, depth: int = 0) -> TracedRef | None:
    if isinstance(value, TracedRef):
        return value if value._state is state else None
    if depth > 4:
        return None
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return None
    for item in itertools.islice(items, _MAX_ITEMS):
        found = _refs_in(item, state, depth + 1)
        if found is not None:
            return found
    return None


def _places(fn: Any) -> list[tuple[str, Any]]:
    """(description, value) of every place a step can keep a ref for later."""
    out: list[tuple[str, Any]] = []
    func = getattr(fn, "__func__", fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None and hasattr(owner, "__dict__"):
        out.extend((f"the attribute self.{k}", v) for k, v in vars(owner).items())
    for glob_name, v in sorted(getattr(func, "__globals__", {}).items(),
                               key=lambda kv: kv[0]):
        out.append((f"the global {glob_name}", v))
    code = getattr(func, "__code__", None)
    for cell_name, cell in zip(getattr(code, "co_freevars", ()),
                               getattr(func, "__closure__", None) or (), strict=False):
        try:
            out.append((f"the enclosing variable {cell_name}", cell.cell_contents))
        except ValueError:
            continue  # an empty cell
    return out


def check_escapes(fn: Any, state: StepState) -> None:
    """Raise if a ref of this trace was kept in a global, a closure cell or ``self``.

    Raises:
        EscapedRefError: names the place and the line that made the ref.
    """
    for where, value in _places(fn):
        ref = _refs_in(value, state)
        if ref is not None:
            raise EscapedRefError(
                f"{ref._loc.short()}: {ref._origin()} escapes the step into {where}; a ref "
                "lives only inside its step (the next execution cannot read the last one's "
                "result): return it from the step instead", loc=ref._loc.short())
