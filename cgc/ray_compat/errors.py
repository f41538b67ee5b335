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
``GraphTornDownError``,             ``RayChannelError`` ("Channel closed.")
``GraphFailedError``
``InputMismatchError``              unchanged: already a ``ValueError``, as Ray's is
==================================  =====================================================

Messages are Ray 2.60's, quoting the settings in ``RayWords`` (a capacity or buffered-results
error, a get or submit timeout); the cgc error stays attached as ``__cause__``, so its full
message (where each actor was blocked, which actor died) is still printed under Ray's.

Example::

    try:
        value = graph.execute(x).get()
    except CgcError as exc:
        raise to_ray_error(exc) from exc
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cgc.runtime import errors as rt

__all__ = ["RayWords", "to_ray_error"]


@dataclass(frozen=True)
class RayWords:
    """The settings Ray's messages quote, as the user gave them to Ray (seconds: -1 means
    forever, as in Ray). None: say it without the number."""

    submit_timeout: float | None = None
    get_timeout: float | None = None
    max_inflight: int | None = None
    max_buffered: int | None = None


def _capacity_text(exc: rt.CapacityExceededError) -> str | None:
    if isinstance(exc, rt.ResultBufferFullError):
        if not exc.limit:  # the byte limit, which Ray does not have: cgc's words
            return None
        return (f"The compiled graph can't have more than {exc.limit} buffered results, and "
                f"you currently have {exc.buffered} buffered results. Call `ray.get()` on "
                "CompiledDAGRef's (or await on CompiledDAGFuture's) to retrieve results, or "
                "increase `_max_buffered_results` if buffering is desired, note that this "
                "will increase driver memory usage.")
    if not exc.capacity:
        return None
    return (f"The compiled graph can't have more than {exc.capacity} in-flight executions, "
            f"and you currently have {exc.in_flight} in-flight executions. Retrieve an output "
            "using ray.get before submitting more requests or increase "
            "`_max_inflight_executions`. `dag.experimental_compile(_max_inflight_executions"
            "=...)`")


def _timeout_text(exc: rt.GetTimeoutError | rt.SubmitTimeoutError, words: RayWords) -> str:
    if isinstance(exc, rt.SubmitTimeoutError):
        return ("If the execution is expected to take a long time, increase "
                f"RAY_CGRAPH_submit_timeout which is currently {words.submit_timeout} "
                "seconds. Otherwise, this may indicate that execution is hanging.")
    return ("If the execution is expected to take a long time, increase "
            f"RAY_CGRAPH_get_timeout which is currently {words.get_timeout} seconds. "
            "Otherwise, this may indicate that the execution is hanging.")


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


def _direct_return_error(exc: rt.RemoteError) -> BaseException:
    """Ray's ValueError for a ``_direct_return`` edge given something else than a tensor
    (the value as cgc's message quotes it)."""
    found = re.search(r"\(`(.*?)`\) as output", str(exc))
    value = found.group(1) if found else "?"
    return ValueError("Task annotated with _direct_return=True must return a CUDA "
                      f"torch.Tensor, instead found value `{value}`. DAG will shut down.")


def to_ray_error(exc: BaseException, words: RayWords | None = None) -> BaseException:
    """The Ray exception that Ray Compiled Graph raises where cgc raised ``exc``, with
    Ray 2.60's message (``words`` holds the settings it quotes); cgc's message stays on
    the cause.

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

    words = words or RayWords()
    if isinstance(exc, rt.RemoteError):
        if exc.cause_type.endswith("DirectReturnError"):
            return _direct_return_error(exc)
        return _task_error(exc)
    if isinstance(exc, (rt.GetTimeoutError, rt.SubmitTimeoutError)):
        return rx.RayChannelTimeoutError(_timeout_text(exc, words))
    if isinstance(exc, rt.CapacityExceededError):
        return rx.RayCgraphCapacityExceeded(_capacity_text(exc) or str(exc))
    if isinstance(exc, rt.ActorDiedError):
        return rx.ActorDiedError()
    if isinstance(exc, (rt.GraphTornDownError, rt.GraphFailedError)):
        return rx.RayChannelError("Channel closed.")
    return exc
