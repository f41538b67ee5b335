"""Ray's ref types for a cgc graph: ``CgcDAGRef`` (``ray.get`` takes it) and ``CgcDAGFuture``
(``await`` takes it).

``ray.get`` hands a ``ray.experimental.compiled_dag_ref.CompiledDAGRef`` (or a list of
them) to the ref's own ``get(timeout=)``, so a subclass that fetches from cgc is all it
takes; copying, pickling and passing one to a Ray task stay refused exactly as Ray refuses
them (inherited). Each wraps one ``cgc.runtime.Ref``; dropping it unfetched frees the result.

Example::

    ref = compiled.execute(1)        # a CgcDAGRef
    ray.get(ref, timeout=5)          # -> the value, or Ray's exception types
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ray.experimental.compiled_dag_ref import CompiledDAGFuture, CompiledDAGRef

from cgc.ray_compat.errors import to_ray_error
from cgc.runtime import ray_internals as ri
from cgc.runtime.errors import CgcError

__all__ = ["CgcDAGRef", "CgcDAGFuture"]

# Ray's "forever" (a negative timeout) in cgc's terms: cgc's None means the graph's default
# and start()'s 0 means no limit, so a long finite wait stands in for it.
FOREVER_S = 1e9


def _cgc_timeout(timeout: float | None, default: float | None) -> float | None:
    """Ray's get timeout (None: the graph's default, -1 or any negative: forever) for cgc."""
    if timeout is None:
        return default
    return FOREVER_S if timeout < 0 else timeout


def _wrap(obj: CgcDAGRef | CgcDAGFuture, dag: Any, ref: Any) -> None:
    """What both ref types hold: their ``CompiledDAG``, the cgc ``Ref``, and Ray's fields
    (Ray's ``__init__`` is skipped: it reads Ray's channels)."""
    obj._ref = ref
    ri.init_ref(obj, dag, ref.exec_index, ref.output_index if dag._multi else None)


def _describe(obj: CgcDAGRef | CgcDAGFuture, ray_name: str) -> str:
    """``str()`` of either ref type, exactly as Ray prints its own (the id is the graph's)."""
    f = ri.ref_fields(obj)
    return (f"{ray_name}({f.dag.get_id()}, execution_index="
            f"{f.execution_index}, channel_index={f.channel_index})")


def _note(obj: CgcDAGRef | CgcDAGFuture, books: str) -> None:
    """Note the ref's execution and output in its graph's ``books`` ("got" or "dropped")."""
    f = ri.ref_fields(obj)
    if books == "got":
        f.dag._note(f.dag._got, f.execution_index, f.channel_index)
    else:
        f.dag._dropped(f.execution_index, f.channel_index)


def _named_as_ray(cls: type, ray_cls: type) -> type:
    """Give ``cls`` the name of the Ray class it stands in for: Ray's own messages name the
    type (``ray.wait(ref)``: "expected a list of ray.ObjectRef ..., got <class
    'ray.experimental.compiled_dag_ref.CompiledDAGRef'>"), and a Ray program sees Ray's."""
    cls.__module__ = ray_cls.__module__
    cls.__name__ = ray_cls.__name__
    cls.__qualname__ = ray_cls.__qualname__
    return cls


class CgcDAGRef(CompiledDAGRef):
    """One output of one execution of a cgc-backed ``CompiledDAG``; ``ray.get`` it once."""

    def __init__(self, dag: Any, ref: Any) -> None:
        _wrap(self, dag, ref)

    def get(self, timeout: float | None = None) -> Any:
        """The value (``ray.get(ref, timeout=)`` calls this).

        Raises:
            ValueError: fetched before (Ray's rule: once per ref).
            RayTaskError (an instance of the app's exception class too),
            RayChannelTimeoutError, RayCgraphCapacityExceeded, RayChannelError,
            ActorDiedError: see ``cgc.ray_compat.errors``.
        """
        if self._ref.fetched:
            raise ValueError("ray.get() can only be called once on a CompiledDAGRef, and it "
                             "was already called.")
        ri.note_fetched(self)
        dag = ri.ref_fields(self).dag
        try:
            value = self._ref.get(_cgc_timeout(timeout, dag._get_timeout))
        except CgcError as exc:
            if self._ref.fetched:  # the app's error: the ref is used up
                _note(self, "got")
                dag._after_get()
                dag._app_error()
            # A timeout or a full buffer loses nothing: unlike Ray, the ref can be fetched
            # again; once a value or the app's error was returned, it cannot.
            raise to_ray_error(exc, dag._words) from exc
        _note(self, "got")
        dag._after_get()
        return value

    def __del__(self) -> None:
        # The wrapped cgc Ref frees an unfetched result when it goes; Ray's books note it.
        try:
            if not self._ref.fetched and not ri.ref_fields(self).dag.is_teardown:
                _note(self, "dropped")
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __str__(self) -> str:
        return _describe(self, "CompiledDAGRef")


class CgcDAGFuture(CompiledDAGFuture):
    """One output of one ``execute_async`` execution; ``await`` it once."""

    def __init__(self, dag: Any, ref: Any) -> None:
        _wrap(self, dag, ref)
        self._awaited = False

    def __await__(self) -> Generator[Any, None, Any]:
        if self._awaited:
            raise ValueError("CompiledDAGFuture can only be awaited upon once, and it has "
                             "already been awaited upon.")
        self._awaited = True
        return self._wait().__await__()

    async def _wait(self) -> Any:
        dag = ri.ref_fields(self).dag
        try:
            return await self._ref
        except CgcError as exc:
            if self._ref.fetched:  # the app's error (see CgcDAGRef.get)
                dag._app_error()
            raise to_ray_error(exc, dag._words) from exc
        finally:
            if self._ref.fetched:
                _note(self, "got")

    def __del__(self) -> None:
        try:  # as CgcDAGRef
            if not self._ref.fetched and not ri.ref_fields(self).dag.is_teardown:
                _note(self, "dropped")
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __str__(self) -> str:
        return _describe(self, "CompiledDAGFuture")


_named_as_ray(CgcDAGRef, CompiledDAGRef)
_named_as_ray(CgcDAGFuture, CompiledDAGFuture)
