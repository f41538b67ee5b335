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

__all__ = ["CompileError", "RayVersionError", "UnsupportedNodeError"]


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
