"""Compile-time errors of the cgc compiler.

``CompileError`` is what the frontend (and the passes) raise for a model that cannot be
compiled. It exits the CLI with ``EXIT_INVALID_INPUT`` (3) and its message always names
the culprit: the node (``w1.fwd#2``), the actor class and method (``Worker.fwd``) and the
user's source line (``model.py:14``), then says how to fix it.
"""

from __future__ import annotations

# Both live in the shared error module: the registry of Ray's internals, in the runtime,
# raises RayVersionError (a CompileError) and may not import the compiler.
from cgc.plan_schema.errors import CompileError, RayVersionError

__all__ = [
    "CompileError",
    "RayVersionError",
    "UnsupportedNodeError",
    "TraceError",
    "RefUsedAsValueError",
    "GetInStepError",
    "TaskInStepError",
    "ActorInStepError",
    "StepArgumentsError",
    "EscapedRefError",
]


class UnsupportedNodeError(CompileError, NotImplementedError):
    """The graph holds a node kind cgc cannot compile (a Ray remote function's
    ``FunctionNode``, say). Also a ``NotImplementedError``, which is what Ray Compiled
    Graph raises for it, so code written for Ray catches it unchanged.

    Example::

        try:
            cgc.compile(f.bind(inp))        # f is a @ray.remote function
        except NotImplementedError as exc:
            print(exc)                      # names the function and its bind line
    """


class TraceError(CompileError):
    """A step function of plain Ray actor calls cannot be traced into a static graph.

    Raised while the step runs once at trace time, so the traceback ends in the user's
    step; the message starts with ``file:line`` of the user's code (also in ``loc``).

    Example::

        try:
            cgc.compile(step, example_inputs=(x,))
        except cgc.errors.TraceError as exc:
            print(exc.loc)              # "prog.py:12"
    """


class RefUsedAsValueError(TraceError, TypeError):
    """A traced ref was used as a Python value (``if ref:``, ``ref + 1``, ``ref[0]``,
    ``len(ref)``, iteration, attribute access): at trace time it has no value."""


class GetInStepError(TraceError):
    """``ray.get``/``ray.wait`` on a traced ref inside the step: the value exists only
    when the graph runs."""


class TaskInStepError(TraceError):
    """A Ray remote function (a task) was called in the step: graphs hold actor calls."""


class ActorInStepError(TraceError):
    """An actor was created inside the step: a graph's actors exist before it runs."""


class StepArgumentsError(TraceError, TypeError):
    """A step's arguments do not fit it: ``cgc.compile(step)`` without the
    ``example_inputs`` its parameters need, or a ``@cgc.trace`` step called with other
    arguments than the graph it was traced into takes. Names the caller's line and what
    to pass."""


class EscapedRefError(TraceError):
    """A traced ref left its step (a global, a closure, an object kept for later) or was
    used after its trace ended (in another step, ``ray.get`` later, pickled)."""
