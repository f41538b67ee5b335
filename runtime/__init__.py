"""cgc's runtime: load a plan, start it on Ray actors, run it fast, fail clearly.

Depends on the plan contract (``cgc.plan_schema``, whose ``verify`` subpackage ``start()``
runs), Ray, numpy/torch only - never on the compiler (``cgc.frontend``, ``cgc.passes``,
``cgc.ir``) or networkx.

Example::

    import cgc.runtime as rt
    plan = rt.load("echo.cgplan")
    with plan.start(get_timeout=10) as graph:
        ref = graph.execute("hi")
        print(ref.get())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cgc.plan_schema.errors import CgcError, PlanFormatError, UntrustedPlanError
from cgc.runtime.errors import (
    ActorDiedError,
    CapacityExceededError,
    CgcTimeoutError,
    DirectReturnError,
    GetTimeoutError,
    GraphFailedError,
    GraphTornDownError,
    InputMismatchError,
    InputSerializationError,
    PlacementError,
    RefConsumedError,
    RemoteError,
    ResultBufferFullError,
    SetupError,
    ShmSpaceError,
    SubmitTimeoutError,
)
from cgc.runtime.plan import Plan, load
from cgc.runtime.refs import Ref

if TYPE_CHECKING:
    from cgc.runtime.driver import CompiledGraph


def __getattr__(name: str) -> object:
    # Why lazy: the driver brings the channels, numpy and the transports (~70 ms), which
    # `cgc compile` (it needs only Plan, to save one) must not pay for.
    if name == "CompiledGraph":
        from cgc.runtime.driver import CompiledGraph

        return CompiledGraph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Plan",
    "load",
    "CompiledGraph",
    "Ref",
    "CgcError",
    "PlanFormatError",
    "UntrustedPlanError",
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
    "DirectReturnError",
]
