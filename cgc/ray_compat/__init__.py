"""Ray Compiled Graph programs on cgc, unchanged: ``cgc.ray_compat.install()``.

After ``install()``, ``dag.experimental_compile(...)`` on any Ray DAG compiles it with cgc
and starts it (``cgc.ray_compat.compiled``); ``execute``/``execute_async`` return refs that
``ray.get`` and ``await`` take; errors are Ray's exception types
(``cgc.ray_compat.errors``). Ray's DAG nodes also remember their ``.bind()`` lines while it
is installed, so compile errors point at the user's code. ``uninstall()`` restores Ray.

Example::

    import ray, cgc.ray_compat
    cgc.ray_compat.install()               # the one-line migration
    with ray.dag.InputNode() as inp:
        dag = worker.fwd.bind(inp)
    compiled = dag.experimental_compile()  # a cgc graph
    print(ray.get(compiled.execute(1)))
    compiled.teardown()
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from typing import Any

from cgc.ray_compat.communicators import CustomCommunicatorError
from cgc.ray_compat.compiled import CompiledDAG, compile_ray_dag
from cgc.ray_compat.errors import to_ray_error
from cgc.ray_compat.refs import CgcDAGFuture, CgcDAGRef

__all__ = [
    "install",
    "uninstall",
    "installed",
    "CompiledDAG",
    "CgcDAGRef",
    "CgcDAGFuture",
    "compile_ray_dag",
    "to_ray_error",
    "CustomCommunicatorError",
]

_LOCK = threading.Lock()
_state: dict[str, Any] = {}  # "original": Ray's method, "sites": the bind-site recorder


def _experimental_compile(self: Any, *args: Any, **kwargs: Any) -> CompiledDAG:
    """``DAGNode.experimental_compile`` while cgc.ray_compat is installed (Ray's arguments).

    Why forwarded as is: ``compile_ray_dag`` holds the one list of Ray's arguments (same
    order as Ray's), so the two cannot drift apart.
    """
    return compile_ray_dag(self, *args, **kwargs)


def _no_serialization(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__name__}: a compiled graph's ref cannot be serialized "
                    "(put in the object store or passed to a Ray task)")


def _refuse_ray_serialization(on: bool) -> None:
    """Ray's serializer refuses its own ref types by exact type; refuse ours the same way
    (``ray.put([ref])`` is then a TypeError, as in Ray, not the pickling ValueError)."""
    from ray import cloudpickle

    for cls in (CgcDAGRef, CgcDAGFuture):
        if on:
            cloudpickle.CloudPickler.dispatch[cls] = _no_serialization
        else:
            cloudpickle.CloudPickler.dispatch.pop(cls, None)


def install() -> None:
    """Make ``ray.dag.DAGNode.experimental_compile`` compile with cgc; idempotent.

    Example: ``cgc.ray_compat.install()`` once, before compiling.

    Raises:
        RayVersionError: the installed Ray lacks an internal cgc's Ray adapter patches.
    """
    from ray.dag.dag_node import DAGNode

    from cgc.frontend import record_ray_bind_sites

    with _LOCK:
        if _state:
            return
        sites = contextlib.ExitStack()
        sites.enter_context(record_ray_bind_sites())
        _state["original"] = DAGNode.__dict__["experimental_compile"]
        _state["sites"] = sites
        DAGNode.experimental_compile = _experimental_compile
        _refuse_ray_serialization(True)
    # Close the recorder before interpreter teardown, while its module is still whole.
    atexit.register(uninstall)


def uninstall() -> None:
    """Give ``experimental_compile`` back to Ray; graphs already compiled keep running.

    Example: ``cgc.ray_compat.uninstall()``.
    """
    from ray.dag.dag_node import DAGNode

    with _LOCK:
        if not _state:
            return
        DAGNode.experimental_compile = _state.pop("original")
        _state.pop("sites").close()
        _refuse_ray_serialization(False)


def installed() -> bool:
    """Whether ``install()`` is in force.

    Example: ``assert cgc.ray_compat.installed()`` after ``install()``.
    """
    return bool(_state)
