"""Compile-time errors of the cgc compiler.

``CompileError`` is what the frontend (and the passes) raise for a model that cannot be
compiled. It exits the CLI with ``EXIT_INVALID_INPUT`` (3) and its message always names
the culprit: the node (``w1.fwd#2``), the actor class and method (``Worker.fwd``) and the
user's source line (``model.py:14``), then says how to fix it.
"""

from __future__ import annotations

from cgc.plan_schema.errors import EXIT_INVALID_INPUT, CgcError

__all__ = ["CompileError", "RayVersionError", "UnsupportedNodeError"]


class CompileError(CgcError):
    """The model or graph is invalid; the message names the node, class.method and line.

    Example::

        raise CompileError(
            "model.py:14: w1.fwd#2 (Worker.fwd): fwd() takes 1 argument but 2 were bound",
            node="w1.fwd#2", actor="w1", method="fwd", loc="model.py:14",
        )

    Attributes:
        node: the node's name (``"w1.fwd#2"``), or ``""`` when the error is not about one.
        actor: the actor's name in the graph (``"w1"``), or ``""``.
        method: the method name (``"fwd"``), or ``""``.
        loc: ``"file:line"`` of the user's code the error is about, or ``""``.
    """

    exit_code = EXIT_INVALID_INPUT

    def __init__(
        self,
        message: str,
        *,
        node: str = "",
        actor: str = "",
        method: str = "",
        loc: str = "",
    ) -> None:
        super().__init__(message)
        self.node = node
        self.actor = actor
        self.method = method
        self.loc = loc


class RayVersionError(CompileError):
    """The installed Ray lacks an internal that cgc's Ray DAG adapter uses.

    Raised instead of an ``AttributeError`` when a Ray release renamed or removed one of
    the private attributes or functions listed in ``cgc.frontend.ray_private``; the
    message names the installed Ray version and the missing internal.

    Example::

        RayVersionError("the installed Ray 3.0.0 has no <internal>, which cgc's Ray DAG "
                        "adapter uses (it was written for Ray 2.60); install ...")
    """


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
