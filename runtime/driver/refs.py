"""``Ref``: the handle ``CompiledGraph.execute()`` returns for one output of one execution.

``ref.get(timeout)`` returns the value or raises (the user's exception type for a failing
method, a typed cgc error for timeouts and failures); each result is fetched exactly once;
results may be fetched in any order; dropping a ref frees its result. ``await ref`` runs the
same ``get`` on the graph's small thread pool (one mechanism for sync and async).

Where Ray is loaded, a graph's refs are also Ray ``CompiledDAGRef`` s (``ref_type()``), so
``ray.get(ref)`` and ``ray.get([refs], timeout=)`` call ``get`` as they do on Ray's compiled
graph refs. ``ray.wait`` takes no compiled graph ref, Ray's or cgc's: its ``TypeError``
names the ref's type, whose name then says what to call instead.

Example::

    ref = graph.execute(3)
    value = ref.get(timeout=5)          # or: value = await ref, or ray.get(ref, timeout=5)
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from cgc.runtime.errors import RefConsumedError

if TYPE_CHECKING:
    from cgc.runtime.driver.result_book import ResultBook

__all__ = ["Ref", "RefType", "ref_type"]

WAIT_ADVICE = ("a cgc ref: ray.wait() takes no compiled graph ref (Ray's CompiledDAGRef "
               "neither); fetch it with ray.get(ref, timeout=...) or ref.get(timeout=...), "
               "or await it")


class RefType(type):
    """The type of cgc's refs: Ray's ``ray.wait`` error prints the type, so it says what to
    call instead (``got list containing <class 'cgc.runtime.Ref'> (a cgc ref: ...)``).

    Example: ``repr(type(graph.execute(1)))`` names ``ray.get`` and ``ref.get``.

    Raises:
        Nothing: a type.
    """

    def __repr__(cls) -> str:
        return f"<class '{cls.__module__}.{cls.__qualname__}'> ({WAIT_ADVICE})"


class Ref(metaclass=RefType):
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

    __str__ = __repr__


@functools.cache
def _ray_ref_type(ray_loaded: bool) -> type[Ref]:
    """``Ref``, or where Ray is loaded a ``Ref`` that is also Ray's ``CompiledDAGRef``."""
    if not ray_loaded:
        return Ref
    from ray.experimental.compiled_dag_ref import CompiledDAGRef

    # Ref first: its get, __del__, __str__ and slots; Ray's __init__ and fields unused.
    # Copying and pickling are refused as Ray refuses them for its compiled graph refs.
    class RayRef(Ref, CompiledDAGRef):  # type: ignore[misc, unused-ignore]
        __slots__ = ()
        __doc__ = Ref.__doc__

    RayRef.__name__ = RayRef.__qualname__ = "Ref"  # as Ray's messages and repr name it
    return RayRef


def ref_type() -> type[Ref]:
    """The class of the refs ``execute`` returns: ``Ref``, a Ray ``CompiledDAGRef`` too
    where Ray is loaded (``ray.get`` then takes it). Ray is never imported for it.

    Example::

        >>> from cgc.runtime.driver.refs import Ref, ref_type
        >>> issubclass(ref_type(), Ref)
        True

    Raises:
        Nothing.
    """
    return _ray_ref_type("ray" in sys.modules)
