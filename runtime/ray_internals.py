"""Every use of Ray's internals by cgc's runtime and its Ray drop-in, in one place.

The runtime may not import the frontend (whose registry, ``cgc.frontend.ray_private``, lists
the frontend's uses), so this is the runtime's registry, in the same spirit: ``PRIVATE_API``
names each internal, why it is used, and the one accessor through which the rest of cgc
touches it. Written for Ray ``WRITTEN_FOR``; a missing internal makes the accessor return
``None`` (the feature it serves is then skipped, with one warning), never an
``AttributeError`` in the middle of a user's ``ray.shutdown()``.

``ray.dag.compiled_dag_node._compiled_dags`` is Ray's registry of live compiled graphs:
``ray.shutdown()`` (also at interpreter exit) calls ``teardown(kill_actors=True)`` on each
entry first, while Ray is still up, then replaces the registry with a fresh one. Ray has no
public shutdown hook; this is the mechanism Ray uses for its own compiled graphs, so cgc's
graphs end exactly where Ray's do.

Importing this module does not import Ray.

Example::

    reg = compiled_dag_registry()
    if reg is not None:
        reg["cgc-session"] = hook      # a weak reference: keep ``hook`` alive yourself
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NamedTuple

__all__ = ["WRITTEN_FOR", "RayInternal", "PRIVATE_API", "compiled_dag_registry",
           "executable_task_record", "missing_internals"]

WRITTEN_FOR = "2.60"

log = logging.getLogger("cgc.runtime")


class RayInternal(NamedTuple):
    """One internal of Ray that the runtime or the drop-in uses: ``module.name``."""

    module: str
    name: str
    why: str


_CDN = "ray.dag.compiled_dag_node"

PRIVATE_API: tuple[RayInternal, ...] = (
    RayInternal(_CDN, "_compiled_dags", "ray.shutdown() tears down each entry first: cgc's "
                "session hook (runtime/session.py) is one, for every cgc graph"),
    RayInternal(_CDN, "_ExecutableTaskRecord", "Ray's per-task profiling record, which a "
                "RAY_CGRAPH_ENABLE_PROFILING user reads off the actor (runtime/ray_events.py)"),
)

_warned: set[str] = set()


def _lookup(module: str, name: str) -> Any:
    mod = sys.modules.get(module)
    if mod is None:
        import importlib

        mod = importlib.import_module(module)
    return getattr(mod, name)


def compiled_dag_registry() -> Any:
    """Ray's registry of compiled graphs that ``ray.shutdown()`` tears down (a
    ``WeakValueDictionary``: id -> object with ``teardown(kill_actors=...)``), looked up
    afresh on each call because every shutdown replaces it; None if this Ray has none.

    Example: ``compiled_dag_registry()[dag.get_id()] = dag``.

    Raises:
        Nothing; a Ray without it gives None and one warning.
    """
    try:
        return _lookup(_CDN, "_compiled_dags")
    except (ImportError, AttributeError):
        if _CDN not in _warned:
            _warned.add(_CDN)
            version = getattr(sys.modules.get("ray"), "__version__", "?")
            log.warning("cgc: Ray %s has no %s._compiled_dags (cgc was written for Ray %s): "
                        "ray.shutdown() will not tear cgc's graphs down first; tear them "
                        "down before shutting Ray down", version, _CDN, WRITTEN_FOR)
        return None


def executable_task_record() -> Any:
    """Ray's profiling record class (a dataclass: ``actor_classname``, ``actor_name``,
    ``actor_id``, ``method_name``, ``bind_index``, ``operation``, ``start_t``, ``end_t``).

    Example: ``executable_task_record()(actor_classname="A", ..., end_t=1.0)``.

    Raises:
        cgc.runtime.errors.SetupError: this Ray has none (profiling cannot run as Ray's).
    """
    try:
        return _lookup(_CDN, "_ExecutableTaskRecord")
    except (ImportError, AttributeError):
        from cgc.runtime.errors import SetupError

        version = getattr(sys.modules.get("ray"), "__version__", "?")
        raise SetupError(f"RAY_CGRAPH_ENABLE_PROFILING: Ray {version} has no "
                         f"{_CDN}._ExecutableTaskRecord (cgc was written for Ray "
                         f"{WRITTEN_FOR}); use start(trace=...) instead") from None


def missing_internals() -> list[str]:
    """The entries of ``PRIVATE_API`` the installed Ray lacks (``module.name`` each).

    Example: ``assert not missing_internals()`` on the Ray cgc was written for.

    Raises:
        Nothing.
    """
    out = []
    for use in PRIVATE_API:
        try:
            _lookup(use.module, use.name)
        except (ImportError, AttributeError):
            out.append(f"{use.module}.{use.name}")
    return out
