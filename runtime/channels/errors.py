"""Channel errors and the error record that travels through channels in place of a value.

Example:
    >>> from cgc.runtime.channels import ErrorValue
    >>> try:
    ...     raise ValueError("bad input")
    ... except ValueError as e:
    ...     ev = ErrorValue.from_exception(e, actor="w1", method="fwd", exec_index=3)
    >>> ev.type_name, ev.message, ev.exec_index
    ('ValueError', 'bad input', 3)
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any

from cgc.plan_schema.errors import CgcError

__all__ = ["ChannelError", "ChannelClosedError", "ChannelTimeoutError", "ErrorValue"]


class ChannelError(CgcError):
    """Base of the data-plane errors (exit code 1: a runtime failure)."""


class ChannelClosedError(ChannelError):
    """The channel was closed or poisoned (teardown, or a peer died)."""


class ChannelTimeoutError(ChannelError, TimeoutError):
    """A read or write did not complete within its timeout."""


class ErrorValue:
    """An upstream failure carried through a channel in place of a value.

    Readers tell it from data with ``isinstance(v, ErrorValue)``. The original exception is
    kept when it pickles; otherwise ``exception`` is None and ``type_name``/``message`` hold
    what is known, so an unpicklable exception can never break the channel.

    Attributes:
        exception: the original exception object, or None if it could not travel.
        type_name: qualified name of the exception's class (``"builtins.ValueError"`` style
            without the ``builtins.`` prefix).
        message: ``str(exception)``.
        traceback_text: the formatted remote traceback.
        actor, method: where it happened; exec_index: the execution it belongs to.
        extra: free-form dict for the executor's own fields.
    """

    __slots__ = ("exception", "type_name", "message", "traceback_text", "actor", "method",
                 "exec_index", "extra")

    def __init__(self, exception: BaseException | None, type_name: str = "", message: str = "",
                 traceback_text: str = "", actor: str = "", method: str = "",
                 exec_index: int = -1, extra: dict[str, Any] | None = None) -> None:
        self.exception = exception
        if exception is not None:
            cls = type(exception)
            mod = cls.__module__
            type_name = type_name or (cls.__qualname__ if mod == "builtins"
                                      else f"{mod}.{cls.__qualname__}")
            message = message or str(exception)
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        self.actor = actor
        self.method = method
        self.exec_index = exec_index
        self.extra = extra or {}

    @classmethod
    def from_exception(cls, exc: BaseException, actor: str = "", method: str = "",
                       exec_index: int = -1, **extra: Any) -> ErrorValue:
        """Wrap ``exc`` (call inside the ``except`` block so the traceback is complete).

        Example:
            >>> ErrorValue.from_exception(KeyError("k"), actor="a", method="m").type_name
            'KeyError'
        """
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(exc, traceback_text=tb, actor=actor, method=method,
                   exec_index=exec_index, extra=extra)

    def __reduce__(self) -> tuple[Any, ...]:
        # Why: an exception that does not round-trip through pickle must not break the
        # channel; ship it only when dumps+loads both work, else only its text.
        exc = self.exception
        if exc is not None:
            try:
                pickle.loads(pickle.dumps(exc, protocol=5))
            except Exception:  # noqa: BLE001 - anything unpicklable degrades to text
                exc = None
        return (ErrorValue, (exc, self.type_name, self.message, self.traceback_text,
                             self.actor, self.method, self.exec_index, self.extra))

    def __repr__(self) -> str:
        return (f"ErrorValue({self.type_name}: {self.message!r}, actor={self.actor!r}, "
                f"method={self.method!r}, exec_index={self.exec_index})")
