"""Small objects the driver and the actor loops exchange through channels.

- ``PING``: the warm-up value sent once through every edge at start.
- ``CallArgs``: the whole input of one execution (positional and keyword arguments), sent on
  the INPUT node's channel when a task takes the input itself. A task bound to the bare
  input node gets the single positional argument when the call had exactly one and no
  keywords (Ray's rule), else the ``CallArgs``.

Example:
    >>> input_value((3,), {})
    3
    >>> input_value((1, 2), {}).args
    (1, 2)
"""

from __future__ import annotations

from typing import Any

__all__ = ["Ping", "PING", "CallArgs", "input_value", "input_attr"]


class Ping:
    """The warm-up marker (one instance per process; compare with ``type(v) is Ping``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ping, ())

    def __repr__(self) -> str:
        return "PING"


PING = Ping()


def _ping() -> Ping:
    return PING


class CallArgs:
    """Positional and keyword arguments of one ``execute()`` call."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs

    def __reduce__(self) -> tuple[Any, ...]:
        return (CallArgs, (self.args, self.kwargs))

    def __repr__(self) -> str:
        return f"CallArgs(args={self.args!r}, kwargs={self.kwargs!r})"


def input_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The value the INPUT node stands for in one execution."""
    if len(args) == 1 and not kwargs:
        return args[0]
    return CallArgs(args, kwargs)


def input_attr(whole: Any, index: int | None, field: str | None) -> Any:
    """One INPUT_ATTR value (``inp[index]`` or ``inp.field``) from the whole input value."""
    if isinstance(whole, CallArgs):
        return whole.args[index or 0] if field is None else whole.kwargs[field]
    if field is None and index == 0:
        return whole
    raise KeyError(f"input has no {'field ' + repr(field) if field else 'index ' + str(index)}")
