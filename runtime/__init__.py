"""cgc's runtime: load a plan, start it on Ray actors, run it fast, fail clearly.

Depends on the plan contract (``cgc.plan_schema``, whose ``verify`` subpackage ``start()``
runs), Ray, numpy/torch only - never on the compiler (``cgc.frontend``, ``cgc.passes``,
``cgc.ir``) or networkx.

Where each module runs (the folder says it):

- ``driver/``   the user's process: ``Plan``, start, ``CompiledGraph``, results, teardown.
- ``actor/``    each actor's process: the loop that replays the actor's program.
- ``channels/`` host channels (shared-memory rings, TCP), both sides.
- ``comm/``     communicators (CPU, NCCL, CUDA IPC, torch.distributed), in the actors.
- ``gpu/``      streams, tensor headers and CUDA graphs, in the actors.
- ``ray_internals/`` every use of Ray's private API, in one place.
- shared modules at the top: ``errors``, ``messages`` (what the driver and the loops
  exchange), ``endpoints`` (opening the channels and communicators a plan names),
  ``devices``, ``embedded``, ``trace``, ``profiling``.

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
from cgc.runtime.driver.plan import Plan, load
from cgc.runtime.driver.refs import Ref
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

if TYPE_CHECKING:
    from cgc.runtime.driver.graph import CompiledGraph


def __getattr__(name: str) -> object:
    # Why lazy: the driver brings the channels, numpy and the transports (~70 ms), which
    # `cgc compile` (it needs only Plan, to save one) must not pay for.
    if name == "CompiledGraph":
        from cgc.runtime.driver.graph import CompiledGraph

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
