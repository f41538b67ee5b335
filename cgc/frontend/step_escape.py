"""Finding refs that escape a traced step: kept in a global, a closure or the step's object.

A ref kept so is a value the next execution would read from the last one: the graph
cannot hold that, so the trace fails naming the place and the line the ref was made.
A ref that escapes elsewhere (an object the step was given) is caught when it is used:
its trace is over, and any use raises ``EscapedRefError``.

Example: ``h = w.fwd.remote(x)`` on line 8 and ``CACHE.append(h)`` on line 9 of a step
fail with ``prog.py:9: the ref of Worker.fwd (made at prog.py:8) escapes the step into
the global CACHE ...``: the line named first is where the step uses the place.
"""

from __future__ import annotations

import dis
import itertools
import types
from typing import Any

from cgc.errors import EscapedRefError
from cgc.frontend.locations import RawLoc
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


# Where a place is named in a step's bytecode: (kind of place, opcodes that use the name).
_USES = {
    "global": ("LOAD_GLOBAL", "STORE_GLOBAL", "LOAD_NAME", "STORE_NAME"),
    "attribute": ("LOAD_ATTR", "STORE_ATTR", "LOAD_METHOD"),
    "enclosing": ("LOAD_DEREF", "STORE_DEREF", "LOAD_CLASSDEREF"),
}


def _places(fn: Any) -> list[tuple[str, str, str, Any]]:
    """(description, kind, name, value) of every place a step can keep a ref for later."""
    out: list[tuple[str, str, str, Any]] = []
    func = getattr(fn, "__func__", fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None and hasattr(owner, "__dict__"):
        out.extend((f"the attribute self.{k}", "attribute", k, v)
                   for k, v in vars(owner).items())
    for glob_name, v in sorted(getattr(func, "__globals__", {}).items(),
                               key=lambda kv: kv[0]):
        out.append((f"the global {glob_name}", "global", glob_name, v))
    code = getattr(func, "__code__", None)
    for cell_name, cell in zip(getattr(code, "co_freevars", ()),
                               getattr(func, "__closure__", None) or (), strict=False):
        try:
            out.append((f"the enclosing variable {cell_name}", "enclosing", cell_name,
                        cell.cell_contents))
        except ValueError:
            continue  # an empty cell
    return out


def _lines_naming(fn: Any, kind: str, name: str) -> list[RawLoc]:
    """The lines of the step (nested functions too) that use the place: where a ref went."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    found: list[RawLoc] = []
    todo = [code] if code is not None else []
    while todo:
        c = todo.pop()
        line = c.co_firstlineno
        for ins in dis.get_instructions(c):
            line = ins.positions.lineno if ins.positions and ins.positions.lineno else line
            if ins.opname in _USES[kind] and ins.argval == name:
                loc = RawLoc(c.co_filename, line, c.co_name)
                if loc not in found:
                    found.append(loc)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return sorted(found, key=lambda r: (r.file, r.line))


def check_escapes(fn: Any, state: StepState) -> None:
    """Raise if a ref of this trace was kept in a global, a closure cell or ``self``.

    Raises:
        EscapedRefError: names the line where the ref escaped (the step's lines using the
            place it was kept in), the place, and the line that made the ref.
    """
    for where, kind, name, value in _places(fn):
        ref = _refs_in(value, state)
        if ref is not None:
            lines = _lines_naming(fn, kind, name)
            at = lines[0].short() if lines else ref._loc.short()
            also = f" (the step uses it at {', '.join(r.short() for r in lines)})" \
                if len(lines) > 1 else ""
            raise EscapedRefError(
                f"{at}: {ref._origin()} escapes the step into {where}{also}; a ref "
                "lives only inside its step (the next execution cannot read the last one's "
                "result): return it from the step instead", loc=at)
