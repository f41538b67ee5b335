"""This process's actor loops, by graph id, and what the exited ones left behind.

``cgc.runtime.actor.entry`` finds a graph's loop here (several graphs can share an actor);
``cgc.runtime.actor.executor.ActorLoop`` removes itself and records its exit here when it ends.

Example: ``with LOOPS_LOCK: loop = LOOPS.get(gid)``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the loop class imports this module
    from cgc.runtime.actor.executor import ActorLoop

__all__ = ["LOOPS", "LOOPS_LOCK", "LOOPS_CHANGED", "EXITS", "MAX_EXITS", "TRACES"]

LOOPS: dict[str, ActorLoop] = {}  # graph id -> this process's loop for it
LOOPS_LOCK = threading.Lock()
# Notified (under LOOPS_LOCK) whenever a loop of this process exits.
LOOPS_CHANGED = threading.Condition(LOOPS_LOCK)
# graph id -> crash traceback (or None) of a loop that exited and whose waiter has not
# reported yet; bounded, oldest dropped (a waiter that never runs leaves its entry).
EXITS: dict[str, str | None] = {}
MAX_EXITS = 256
# graph id -> (prologue, loop) recorders of a traced loop; kept after the loop exits so the
# driver collects complete traces at teardown (cgc.runtime.actor.entry.collect_trace).
TRACES: dict[str, tuple[Any, Any]] = {}
