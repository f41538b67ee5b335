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

from cgc.plan_schema.errors import CgcError, CgcTimeoutError

__all__ = ["ChannelError", "ChannelClosedError", "ChannelTimeoutError", "PeerDiedError",
           "ChannelSequenceError", "FrameTooLargeError", "ChannelAuthError", "ShmSecurityError",
           "SegmentExistsError", "UnsupportedPlatformError", "ErrorValue", "decode_error",
           "lost_value"]


class ChannelError(CgcError):
    """Base of the data-plane errors (exit code 1: a runtime failure)."""


class ChannelClosedError(ChannelError):
    """The channel was closed or poisoned (teardown, or a peer died)."""


class ChannelTimeoutError(ChannelError, CgcTimeoutError):
    """A read or write did not complete within its timeout (one of cgc's timeouts: see
    ``CgcTimeoutError``)."""


class PeerDiedError(ChannelClosedError):
    """The process at the other end of a blocked read or write is gone.

    Attributes: ``channel`` (name), ``pid`` (the dead process), ``role`` ("writer" or
    "reader <i>").
    """

    def __init__(self, channel: str, pid: int, role: str) -> None:
        super().__init__(f"channel {channel}: the {role} process (pid {pid}) died")
        self.channel, self.pid, self.role = channel, pid, role

    def __reduce__(self) -> tuple[Any, ...]:
        return (PeerDiedError, (self.channel, self.pid, self.role))


class ChannelSequenceError(ChannelError):
    """A value arrived out of order, or a slot/frame does not hold the value expected next
    (gap, duplicate, torn or overwritten): the stream cannot be trusted any more."""


class FrameTooLargeError(ChannelError):
    """A TCP frame (received or about to be sent) exceeds the channel's maximum size."""


class ChannelAuthError(ChannelError):
    """A TCP peer failed the set-up proof (wrong secret, wrong channel, not cgc)."""


class ShmSecurityError(ChannelError):
    """A shared-memory path is not what cgc created: a symlink, another owner, a wrong
    mode, or not a cgc segment. cgc never maps such a file."""


class SegmentExistsError(ShmSecurityError, FileExistsError):
    """The segment name is taken: a name is only ever created fresh, never attached to."""


class UnsupportedPlatformError(ChannelError):
    """The shared-memory ring is not proven correct on this CPU architecture."""


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

    @property
    def cause(self) -> str:
        """"decode" (the reader could not decode the value), "lost" (an interrupted read
        consumed it), or "" (a failure upstream, e.g. a method that raised)."""
        return str(self.extra.get("cause", ""))

    @property
    def position(self) -> int:
        """For channel-made error values: the value's index on its channel, else -1."""
        return int(self.extra.get("position", -1))

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


def decode_error(channel: str, position: int, exc: BaseException) -> ErrorValue:
    """The error value that takes the place of value ``position`` of ``channel`` when its
    decoding raised ``exc`` in the reader (call inside the ``except`` block).

    It is a plain ``ErrorValue`` (so every ``type(v) is ErrorValue`` check treats it as an
    error for that position) with ``cause == "decode"``; exactly one position is consumed,
    so the values after it keep theirs. Only the exception's text travels (no object, no
    traceback frames that could pin shared memory).

    Example:
        >>> d = decode_error("g-c1", 4, ModuleNotFoundError("no module named 'x'"))
        >>> d.cause, d.position, d.type_name
        ('decode', 4, 'ModuleNotFoundError')
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    cls = type(exc)
    tname = cls.__qualname__ if cls.__module__ == "builtins" \
        else f"{cls.__module__}.{cls.__qualname__}"
    detail = f"{tname}: {exc}"
    return ErrorValue(None, tname, f"channel {channel}: the value at position {position} "
                      f"could not be decoded here: {detail}", tb,
                      extra={"cause": "decode", "channel": channel, "position": position,
                             "detail": detail})


def lost_value(channel: str, position: int) -> ErrorValue:
    """The error value for position ``position`` of ``channel`` when a read that consumed it
    was interrupted (e.g. KeyboardInterrupt) before returning it: that value is gone, the
    ones after it are not (``cause == "lost"``). ``reader.read_at`` returns it.

    Example:
        >>> lost_value("g-c1", 3).cause
        'lost'
    """
    return ErrorValue(None, "LostValue", f"channel {channel}: the value at position {position} "
                      "was consumed by a read that was interrupted before it returned",
                      extra={"cause": "lost", "channel": channel, "position": position})
