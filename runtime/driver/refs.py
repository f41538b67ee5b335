"""``Ref``: the handle ``CompiledGraph.execute()`` returns for one output of one execution.

``ref.get(timeout)`` returns the value or raises (the user's exception type for a failing
method, a typed cgc error for timeouts and failures); each result is fetched exactly once;
results may be fetched in any order; dropping a ref frees its result. ``await ref`` runs the
same ``get`` on the graph's small thread pool (one mechanism for sync and async).

Example::

    ref = graph.execute(3)
    value = ref.get(timeout=5)          # or: value = await ref
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from cgc.runtime.errors import RefConsumedError

if TYPE_CHECKING:
    from cgc.runtime.driver.result_book import ResultBook

__all__ = ["Ref"]


class Ref:
    """One output of one execution: ``get()`` it once, or ``await`` it."""

    __slots__ = ("_book", "exec_index", "output_index", "_done", "__weakref__")

    def __init__(self, book: ResultBook, exec_index: int, output_index: int) -> None:
        self._book = book  # the graph's ResultBook: get() goes straight to it
        self.exec_index = exec_index
        self.output_index = output_index
        self._done = False

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the value and return it.

        ``timeout`` in seconds; None takes the graph's get timeout, which is finite unless
        asked otherwise: the plan's ``get_timeout_s`` (60 s by default,
        ``cgc.plan_schema.defaults.DEFAULTS``), overridden by ``start(get_timeout=...)``
        (0 there means no limit).

        Example: ``graph.execute(1).get(timeout=2.0)``.

        Raises:
            RemoteError: the method raised; also an instance of the original exception
                type, naming actor, method and execution index.
            GetTimeoutError: not ready in time (says where each actor is blocked).
            ResultBufferFullError: fetching it would buffer more than
                ``max_buffered_results`` earlier results.
            ActorDiedError / GraphFailedError: an actor or its loop failed.
            GraphTornDownError: the graph was torn down before the value was read.
            RefConsumedError: this ref was already fetched.
        """
        if self._done:
            raise RefConsumedError(
                f"the result of execution {self.exec_index} (output {self.output_index}) was "
                "already fetched; each ref can be fetched once"
            )
        return self._book.fetch(self, timeout)

    @property
    def fetched(self) -> bool:
        """True once ``get()`` returned the value or raised the execution's error (the ref
        is used up; a timeout or a full buffer leaves it unfetched).

        Example: ``ref.get(); assert ref.fetched``.
        """
        return self._done

    def __await__(self) -> Generator[Any, None, Any]:
        return self._book.fetch_async(self).__await__()

    def __del__(self) -> None:
        if not self._done:
            try:
                self._book.release(self.exec_index)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def __repr__(self) -> str:
        state = "fetched" if self._done else "pending"
        return f"<cgc.Ref execution {self.exec_index} output {self.output_index} ({state})>"
