"""cgc's runtime errors as the exceptions Ray Compiled Graph raises, for code that catches
Ray's types.

==================================  =====================================================
cgc (``cgc.runtime``)               Ray (``ray.exceptions``)
==================================  =====================================================
``RemoteError`` (a method raised)   ``RayTaskError`` made an instance of the app
                                    exception's class (``as_instanceof_cause``), its
                                    message holding the remote traceback
``GetTimeoutError``,                ``RayChannelTimeoutError`` (also a ``TimeoutError``)
``SubmitTimeoutError``
``CapacityExceededError``,          ``RayCgraphCapacityExceeded``
``ResultBufferFullError``
``ActorDiedError``                  ``ActorDiedError``
``GraphTornDownError``,             ``RayChannelError`` ("Channel closed: ...")
``GraphFailedError``
``InputMismatchError``              unchanged: already a ``ValueError``, as Ray's is
==================================  =====================================================

The cgc error stays attached as ``__cause__``, so its full message (where each actor was
blocked, which actor died) is still printed under Ray's.

Example::

    try:
        value = graph.execute(x).get()
    except CgcError as exc:
        raise to_ray_error(exc) from exc
"""

from __future__ import annotations

from typing import Any

from cgc.runtime import errors as rt

__all__ = ["to_ray_error"]


def _task_error(exc: rt.RemoteError) -> BaseException:
    """Ray's form of an app exception: a RayTaskError that is also the app's class."""
    from ray.exceptions import RayTaskError

    cause: Any = exc.cause if exc.cause is not None else exc
    where = f"{exc.actor}.{exc.method}" if exc.actor else exc.method
    text = exc.remote_traceback or f"{exc.cause_type}: {exc._inner_message()}"
    err = RayTaskError(
        function_name=where,
        traceback_str=text,
        cause=cause,
        proctitle=f"ray::{where}",
    )
    return err.as_instanceof_cause()


def to_ray_error(exc: BaseException) -> BaseException:
    """The Ray exception that Ray Compiled Graph raises where cgc raised ``exc``.

    Exceptions that are not cgc runtime errors (and ``InputMismatchError``, already a
    ``ValueError``) come back unchanged.

    Example::

        >>> from cgc.runtime import GraphTornDownError
        >>> type(to_ray_error(GraphTornDownError("graph 'g' was torn down"))).__name__
        'RayChannelError'

    Raises:
        Nothing.
    """
    from ray import exceptions as rx

    if isinstance(exc, rt.RemoteError):
        return _task_error(exc)
    if isinstance(exc, rt.CgcTimeoutError):
        return rx.RayChannelTimeoutError(str(exc))
    if isinstance(exc, rt.CapacityExceededError):
        return rx.RayCgraphCapacityExceeded(str(exc))
    if isinstance(exc, rt.ActorDiedError):
        return rx.ActorDiedError()
    if isinstance(exc, (rt.GraphTornDownError, rt.GraphFailedError)):
        return rx.RayChannelError(f"Channel closed: {exc}")
    return exc
