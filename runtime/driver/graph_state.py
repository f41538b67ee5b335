"""``GraphState``: whether a running graph is going down, and why.

``CompiledGraph`` and its ``ResultBook`` share one: the graph sets ``closing`` when its
teardown begins and records the first failure; both read them before every submit and
read, and raise ``down_error()`` once the graph is down. The first failure recorded wins.

Example::

    state = GraphState("echo", "1a2b3c", teardown=graph.teardown)
    state.record(ActorDiedError, "graph 'echo': actor a died")
    raise state.down_error()      # ActorDiedError("graph 'echo': actor a died")
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cgc.runtime.errors import GraphTornDownError

__all__ = ["GraphState"]


class GraphState:
    """The down state of one graph.

    Attributes:
        closing: True once teardown has begun (for any reason); set by the graph.
        failure: ``(exception class, message, keyword arguments)`` of the first failure
            recorded, else None.
    """

    __slots__ = ("name", "gid", "closing", "failure", "_failed", "_teardown")

    def __init__(self, name: str, gid: str, teardown: Callable[[], None]) -> None:
        self.name = name
        self.gid = gid
        self.closing = False
        self.failure: tuple[type, str, dict[str, Any]] | None = None
        self._failed = threading.Event()
        self._teardown = teardown

    def record(self, cls: type, message: str, **kw: Any) -> None:
        """Record why the graph failed, unless a reason is recorded already.

        Example: ``state.record(GraphFailedError, "graph 'g': lost a channel")``.
        """
        if self.failure is None:
            self.failure = (cls, message, kw)
            self._failed.set()

    def fail_soon(self, cls: type, message: str) -> None:
        """Record a failure (the message gets the graph's name) and tear the graph down
        on a thread of its own: the caller may hold a lock teardown needs.

        Example: ``state.fail_soon(GraphFailedError, "output channel c3: out of order")``.
        """
        self.record(cls, f"graph {self.name!r}: {message}")
        threading.Thread(target=self._teardown, name=f"cgc-fail-{self.gid}",
                         daemon=True).start()

    def down_error(self) -> Exception:
        """The exception for a call on a graph that is down: the recorded failure, else
        ``GraphTornDownError``.

        A poisoned channel may be seen before the monitor has said why: when nothing is
        recorded and teardown has not begun, this waits up to 2 s for the reason.

        Example: ``raise state.down_error()``.
        """
        if self.failure is None and not self.closing:
            self._failed.wait(2.0)
        if self.failure is not None:
            cls, msg, kw = self.failure
            return cls(msg, **kw)
        return GraphTornDownError(f"graph {self.name!r} was torn down")
