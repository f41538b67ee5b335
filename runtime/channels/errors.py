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

__all__ = ["ChannelError", "ChannelClosedError", "ChannelTimeoutError", "PeerDiedError",
           "ChannelSequenceError", "FrameTooLargeError", "ChannelAuthError", "ShmSecurityError",
           "SegmentExistsError", "UnsupportedPlatformError", "ErrorValue", "DecodeError",
           "LostValue"]


class ChannelError(CgcError):
    """Base of the data-plane errors (exit code 1: a runtime failure)."""


class ChannelClosedError(ChannelError):
    """The channel was closed or poisoned (teardown, or a peer died)."""


class ChannelTimeoutError(ChannelError, TimeoutError):
    """A read or write did not complete within its timeout."""


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

    def __reduce__(self) -> tuple[Any, ...]:
        # Why: an exception that does not round-trip through pickle must not break the
        # channel; ship it only when dumps+loads both work, else only its text.
        exc = self.exception
        if exc is not None:
            try:
                pickle.loads(pickle.dumps(exc, protocol=5))
            except Exception:  # noqa: BLE001 - anything unpicklable degrades to text
                exc = None
        return (type(self), (exc, self.type_name, self.message, self.traceback_text,
                             self.actor, self.method, self.exec_index, self.extra))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.type_name}: {self.message!r}, actor={self.actor!r}, "
                f"method={self.method!r}, exec_index={self.exec_index})")


class DecodeError(ErrorValue):
    """A value that reached the reader but could not be decoded there (unpickling raised).

    It takes the place of that one value: exactly one position is consumed, so the values
    after it keep their positions. Only the original exception's text travels (no object,
    no traceback frames that could pin shared memory). ``position`` is the value's index
    on the channel, ``channel`` its name.

    Example:
        >>> d = DecodeError.at("g-c1", 4, ModuleNotFoundError("no module named 'x'"))
        >>> d.position, d.type_name
        (4, 'ModuleNotFoundError')
    """

    __slots__ = ()

    @classmethod
    def at(cls, channel: str, position: int, exc: BaseException) -> DecodeError:
        """The error value for position ``position`` of ``channel`` whose decoding raised
        ``exc`` (call inside the ``except`` block)."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        cls_ = type(exc)
        tname = cls_.__qualname__ if cls_.__module__ == "builtins" \
            else f"{cls_.__module__}.{cls_.__qualname__}"
        return cls(None, tname, f"channel {channel}: the value at position {position} could "
                   f"not be decoded: {tname}: {exc}", tb,
                   extra={"channel": channel, "position": position})

    @property
    def position(self) -> int:
        """Index of the value on its channel (values read before it)."""
        return int(self.extra.get("position", -1))

    @property
    def channel(self) -> str:
        """Name of the channel it was read from."""
        return str(self.extra.get("channel", ""))


class LostValue(DecodeError):
    """The value at ``position`` was taken off the channel by a read that was interrupted
    (e.g. KeyboardInterrupt) before it could return it: that value is gone, the ones after
    it are not. ``reader.read_at(position)`` returns this for such a position.

    Example:
        >>> LostValue.at_position("g-c1", 3).position
        3
    """

    __slots__ = ()

    @classmethod
    def at_position(cls, channel: str, position: int) -> LostValue:
        """The record for the lost value at ``position`` of ``channel``."""
        return cls(None, "LostValue", f"channel {channel}: the value at position {position} "
                   "was consumed by a read that was interrupted before it returned",
                   extra={"channel": channel, "position": position})
