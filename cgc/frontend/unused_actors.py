"""Actors a model binds but its graph never uses: ``record_bound_actors()`` and
``warn_unused_actors()``.

The tracer walks back from the graph's output, so an actor no call of the graph reaches
(``b = Worker.bind()`` and nothing bound on ``b``) is simply not in the plan. That is
almost always a slip in the model, so ``cgc compile`` says so: one warning per such actor,
naming its class and the line of its ``.bind()``.

Example::

    with record_bound_actors() as bound:
        dag = build_dag()
    plan = cgc.compile(dag)
    warn_unused_actors(plan.proto, bound)   # "model.py:9: actor Worker ... is never used"
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Bound", "UnusedActorWarning", "note_bound", "record_bound_actors",
           "warn_unused_actors"]


class UnusedActorWarning(UserWarning):
    """An actor bound while the model was built is in no call of the graph."""


@dataclass
class Bound:
    """One ``Cls.bind(...)``: the class's name and where it was bound."""

    cls: str
    file: str
    line: int
    keep: Any  # the actor itself, kept alive while recording (Ray's nodes are weakly noted)


_RECORDING: list[list[Bound]] = []


def note_bound(actor: Any, cls: str, file: str, line: int) -> None:
    """Record an actor bound at ``file:line`` while ``record_bound_actors()`` is active."""
    if _RECORDING:
        _RECORDING[-1].append(Bound(cls, file, line, actor))


@contextlib.contextmanager
def record_bound_actors() -> Iterator[list[Bound]]:
    """Collect every cgc lazy actor and Ray ``ClassNode`` bound while the block runs."""
    bound: list[Bound] = []
    _RECORDING.append(bound)
    try:
        yield bound
    finally:
        _RECORDING.remove(bound)


def warn_unused_actors(plan: Any, bound: list[Bound]) -> list[str]:
    """Warn (``UnusedActorWarning``) about each bound actor the plan ``plan`` (a
    ``pb.Plan``) does not hold; return the messages.

    Actors are matched by the file name and line of their ``.bind()``: a line that bound
    more actors than the plan has from it left the rest unused.
    """
    in_plan = Counter((os.path.basename(a.loc.file), a.loc.line) for a in plan.graph.actors)
    messages = []
    for b in bound:
        key = (os.path.basename(b.file), b.line)
        if in_plan[key] > 0:
            in_plan[key] -= 1
            continue
        where = f"{os.path.basename(b.file)}:{b.line}" if b.file else "<unknown>"
        messages.append(f"{where}: actor {b.cls} bound here is never used by the graph "
                        "(no call of the graph reaches it): it is not in the plan")
    for m in messages:
        warnings.warn(m, UnusedActorWarning, stacklevel=2)
    return messages
