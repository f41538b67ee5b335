"""Runtime errors, and turning a remote task failure back into the user's exception type.

An exception in a user method travels through channels as a
``cgc.runtime.channels.ErrorValue``; ``raise_error_value`` re-raises it on the driver as
an instance of the original class *and* of ``RemoteError``, so both ``except ValueError``
and ``except cgc.runtime.RemoteError`` work, and the message names actor, method and
execution index.

Example:
    >>> from cgc.runtime.channels import ErrorValue
    >>> try:
    ...     raise KeyError("k")
    ... except KeyError as e:
    ...     ev = ErrorValue.from_exception(e, actor="w1", method="fwd", exec_index=3)
    >>> exc = to_exception(ev)
    >>> isinstance(exc, KeyError) and isinstance(exc, RemoteError), exc.exec_index
    (True, 3)
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from cgc.plan_schema.errors import EXIT_USAGE, CgcError, CgcTimeoutError

__all__ = [
    "CgcError",
    "RemoteError",
    "GraphFailedError",
    "ActorDiedError",
    "GraphTornDownError",
    "CgcTimeoutError",
    "GetTimeoutError",
    "SubmitTimeoutError",
    "CapacityExceededError",
    "ResultBufferFullError",
    "RefConsumedError",
    "InputMismatchError",
    "InputSerializationError",
    "PlacementError",
    "SetupError",
    "ShmSpaceError",
    "WeightSyncMismatchError",
    "DirectReturnError",
    "to_exception",
    "mro_names",
    "format_blocked",
]


class RemoteError(CgcError):
    """A user method raised. Instances are also instances of the original exception class.

    Attributes: ``actor``, ``method``, ``exec_index``, ``remote_traceback`` (text),
    ``cause_type`` (qualified name of the original class), ``cause`` (the original
    exception when it could travel, else None).
    """

    actor: str = ""
    method: str = ""
    exec_index: int = -1
    remote_traceback: str = ""
    cause_type: str = ""
    cause: BaseException | None = None

    def __str__(self) -> str:
        inner = self._inner_message()
        return (
            f"{self.cause_type} in {self.actor}.{self.method} "
            f"(actor {self.actor!r}, execution {self.exec_index}): {inner}"
        )

    def _inner_message(self) -> str:
        if self.cause is not None:
            return str(self.cause)
        return str(self.args[0]) if self.args else ""


class GraphFailedError(CgcError):
    """The graph cannot go on (an actor or its loop failed); it has been torn down."""


class ActorDiedError(GraphFailedError):
    """An actor of the graph died; every pending and later ``get()`` raises this."""

    def __init__(self, message: str, actor: str = "") -> None:
        super().__init__(message)
        self.actor = actor


class GraphTornDownError(CgcError):
    """The graph was torn down before this result was read, or after ``teardown()``."""


class GetTimeoutError(CgcTimeoutError):
    """``Ref.get`` timed out; the message says where each actor is blocked when known.

    ``blocked``: one row per actor, ``{"actor", "execution", "op", "token", "waiting"}``.
    """

    blocked: list[dict[str, Any]] = []


class SubmitTimeoutError(CgcTimeoutError):
    """``execute()`` waited for room (backpressure) longer than the submit timeout."""


class CapacityExceededError(CgcError):
    """``execute()`` at capacity with ``at_capacity="raise"`` (Ray Compiled Graph's behaviour):
    ``capacity`` executions are in flight; fetch results before submitting more.
    ``in_flight`` and ``capacity`` hold the counts."""

    in_flight: int = 0
    capacity: int = 0


class ResultBufferFullError(CapacityExceededError):
    """Fetching a result would buffer more than ``max_buffered_results`` earlier results.
    ``buffered`` is how many are held, ``limit`` the ``max_buffered_results`` in force (0
    when the byte limit was hit instead)."""

    buffered: int = 0
    limit: int = 0


class RefConsumedError(CgcError):
    """A ref's result was already fetched (each result can be fetched exactly once)."""


class InputMismatchError(CgcError, TypeError, ValueError):
    """``execute()`` got arguments that do not match the graph's inputs.

    A ``TypeError`` (Python's choice for a call with the wrong arguments) and a
    ``ValueError`` (Ray Compiled Graph's), so handlers written for either catch it."""

    exit_code = EXIT_USAGE


class InputSerializationError(InputMismatchError):
    """An argument of ``execute()`` cannot be sent to the actors: it cannot be pickled (a
    lambda, a generator, a lock, ...). ``argument`` names it (``"positional argument 0"``,
    ``"keyword argument 'k'"``, ``"the input"``)."""

    def __init__(self, message: str, argument: str = "") -> None:
        super().__init__(message)
        self.argument = argument


class PlacementError(CgcError):
    """Some actors of the plan cannot be placed on the cluster (the message names them)."""


class SetupError(CgcError):
    """Starting the graph failed (actor creation, channel set-up, warm-up)."""


class WeightSyncMismatchError(SetupError):
    """At start, an end of a weight sync found its live module unlike the plan's parameter
    list (a renamed, missing, extra, reshaped or re-typed parameter, or no module at the
    attribute), before any byte moved. The message names the sync, the actor, the
    parameter, and what the plan expects against what the actor holds."""


class ShmSpaceError(SetupError):
    """The plan's shared-memory rings do not fit in the free space of a node's /dev/shm
    (checked at ``start()`` before any ring or, on one node, any actor is made; see
    ``cgc.runtime.driver.shm_space``). The message names the largest rings and the figures;
    ``need`` (bytes the rings commit), ``free`` (bytes free there) and ``channels`` (the
    largest rings' channel ids) hold them."""

    def __init__(self, message: str, need: int = 0, free: int = 0,
                 channels: list[int] | None = None) -> None:
        super().__init__(message)
        self.need = need
        self.free = free
        self.channels = list(channels or [])


class DirectReturnError(CgcError, TypeError):
    """A method's result on an edge the plan declares ``direct_return`` (``Channel.
    direct_return``: exactly one tensor, never wrapped) is not one tensor.

    Raised by ``get()`` of that execution only (as a ``RemoteError`` naming the actor and
    method); the graph keeps serving the next executions.
    """


def mro_names(exc: BaseException) -> list[str]:
    """``module:qualname`` of each class in ``type(exc).__mro__`` (recorded on the actor).

    Why: the driver may not be able to import the exact class (e.g. it lives in a model
    file embedded in the plan), but it can rebuild the nearest importable base, so
    ``except ValueError`` still catches a ``MyError(ValueError)``.
    """
    return [f"{c.__module__}:{c.__qualname__}" for c in type(exc).__mro__]


_dyn_lock = threading.Lock()
_dyn_classes: dict[type, type] = {}


def _remote_class_for(base: type) -> type | None:
    """A class that subclasses both ``base`` and ``RemoteError`` (cached per base)."""
    if issubclass(base, RemoteError):
        return base
    with _dyn_lock:
        cls = _dyn_classes.get(base)
        if cls is None:
            try:
                cls = type(base.__name__, (RemoteError, base), {"__module__": base.__module__})
            except TypeError:  # incompatible layouts: fall back to a plain RemoteError
                return None
            cls.__qualname__ = base.__qualname__
            # Keep our __str__ even when the base defines its own (KeyError does).
            cls.__str__ = RemoteError.__str__  # type: ignore[method-assign,assignment]
            _dyn_classes[base] = cls
    return cls


def _import_class(name: str) -> type | None:
    mod, _, qual = name.partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - not importable here: try the next base
        return None
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def to_exception(ev: Any) -> RemoteError:
    """Build the exception to raise on the driver for an ``ErrorValue``.

    The result is an instance of ``RemoteError`` and, when possible, of the original
    exception class (or its nearest importable base class); the remote traceback is
    attached as a note and in ``remote_traceback``.
    """
    orig = ev.exception
    base: type | None = type(orig) if orig is not None else None
    if base is None:
        for name in (ev.extra or {}).get("mro", []):
            base = _import_class(name)
            if base is not None and base not in (BaseException, object):
                break
            base = None
    cls = _remote_class_for(base) if base is not None and issubclass(base, Exception) else None
    if cls is None:
        cls = RemoteError
    try:
        exc = cls.__new__(cls)  # type: ignore[call-overload]
        if orig is not None and cls is not RemoteError:
            if isinstance(orig, OSError):  # C-level fields that __dict__ does not hold
                for attr in ("errno", "strerror", "filename", "filename2"):
                    setattr(exc, attr, getattr(orig, attr))
            exc.__dict__.update(getattr(orig, "__dict__", {}))
            exc.args = orig.args
        else:
            exc.args = (ev.message,)
    except Exception:  # noqa: BLE001 - exotic __new__: plain RemoteError still says it all
        exc = Exception.__new__(RemoteError)
        exc.args = (ev.message,)
    exc.actor = ev.actor
    exc.method = ev.method
    exc.exec_index = ev.exec_index
    exc.remote_traceback = ev.traceback_text
    exc.cause_type = ev.type_name
    exc.cause = orig
    if ev.traceback_text:
        exc.add_note("remote traceback:\n" + ev.traceback_text.rstrip())
    return exc


def format_blocked(rows: list[dict[str, Any]]) -> str:
    """A hang report as an aligned table, one actor per line.

    Example:
        >>> print(format_blocked([{"actor": "w1", "execution": 3, "op": "1",
        ...                        "token": "2R:c1 (w1.f#0)", "waiting": "a value on c1"}]))
          actor  execution  op  blocked in      waiting for
          w1     3          1   2R:c1 (w1.f#0)  a value on c1
    """
    head = ("actor", "execution", "op", "blocked in", "waiting for")
    body = [(str(r.get("actor", "")), str(r["execution"]) if r.get("execution", -1) >= 0 else "",
             str(r.get("op", "")), str(r.get("token", "")), str(r.get("waiting", "")))
            for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
             for line in [head, *body]]
    return "\n".join(lines)
