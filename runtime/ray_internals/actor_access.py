"""Accessors for actor classes and live actors (frontend and runtime), the runtime's hooks
into Ray, and the drop-in's ref fields."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from cgc.runtime.ray_internals.check import (
    RUNTIME,
    _get,
    _import,
    _resolve,
    installed_version,
)
from cgc.runtime.ray_internals.table import _CDN, _REF, SYSTEM_GROUP, WRITTEN_FOR

log = logging.getLogger("cgc.runtime")


# ------------------------------------------------------------------------- actors
def original_class(body: Any) -> Any:
    """The user's class behind Ray's actor class wrapper (``body`` itself otherwise),
    from the ``__ray_actor_class__`` mark.

    >>> class Plain: ...
    >>> original_class(Plain) is Plain
    True
    """
    return getattr(body, "__ray_actor_class__", body)


def remote_class(obj: Any) -> Any:
    """The user's class behind a ``@ray.remote`` class, or ``obj`` when it is not one.
    Does not import Ray (without ``ray.actor`` loaded nothing is a ``@ray.remote`` class).

    >>> remote_class(int) is int
    True

    Raises:
        RayVersionError: this Ray keeps the user's class elsewhere.
    """
    if "ray.actor" not in sys.modules or not isinstance(obj, _import("ray.actor", "ActorClass")):
        return obj
    return original_class(_get(_get(obj, "__ray_metadata__"), "modified_class"))


def declared_num_returns(method: Any) -> Any:
    """``num_returns`` of ``@ray.method(num_returns=k)`` on ``method``, else None."""
    return getattr(method, "__ray_num_returns__", None)


@dataclass(frozen=True)
class MethodCall:
    """What a live handle's ``actor.m`` says about a call of ``m``: the handle, the
    method's name, its declared ``num_returns`` and ``tensor_transport`` (None if none)."""

    handle: Any
    method: str
    num_returns: Any
    tensor_transport: str | None


def method_call(method: Any) -> MethodCall:
    """Read a Ray ``ActorMethod`` (``handle.fwd``) for tracing a call of it.

    Raises:
        RayVersionError: this Ray keeps these elsewhere.
    """
    return MethodCall(_get(method, "_actor"), str(_get(method, "_method_name")),
                      _get(method, "_num_returns"), _get(method, "_tensor_transport"))


def declared_tensor_transport(method: Any) -> str | None:
    """``tensor_transport`` of ``@ray.method(tensor_transport=...)`` on ``method`` (Ray's
    upper-case name, e.g. ``"GLOO"``), else None."""
    value = getattr(method, "__ray_tensor_transport__", None)
    return value if isinstance(value, str) else None


def enables_tensor_transport(handle: Any) -> bool:
    """Whether a live actor's class has Ray Direct Transport on (``@ray.remote(
    enable_tensor_transport=True)``, or set by Ray for a ``@ray.method(tensor_transport=)``)."""
    return bool(_get(handle, "_ray_enable_tensor_transport"))


def handle_id(handle: Any) -> str:
    """A live actor handle's actor id, in hex."""
    return str(_get(handle, "_ray_actor_id", RUNTIME).hex())


def call_in_actor(handle: Any, fn: Any, *args: Any, system_group: bool = False) -> Any:
    """``fn(actor_self, *args)`` run inside the live actor (Ray's ``__ray_call__``, which
    Ray Compiled Graph uses for the same purpose); an ObjectRef of its result. With
    ``system_group`` it runs in Ray's ``_ray_system`` concurrency group (one thread, apart
    from the actor's own calls), as Ray's compiled graphs wait for their loops.

    Example: ``ray.get(call_in_actor(h, lambda self, k: k + 1, 1)) == 2``.

    Raises:
        RayVersionError: this Ray's actor handles have no ``__ray_call__``.
    """
    method = _get(handle, "__ray_call__", RUNTIME)
    if system_group:
        method = method.options(concurrency_group=SYSTEM_GROUP)
    return method.remote(fn, *args)


def handle_class(handle: Any) -> tuple[str, str]:
    """(module, class name) of a live actor handle's class."""
    desc = _get(handle, "_ray_actor_creation_function_descriptor")
    return str(_get(desc, "module_name")), str(_get(desc, "class_name"))


# ------------------------------------------------------------------------- the runtime
_warned: set[str] = set()


def compiled_dag_registry() -> Any:
    """Ray's registry of compiled graphs that ``ray.shutdown()`` tears down (a
    ``WeakValueDictionary``: id -> object with ``teardown(kill_actors=...)``), looked up
    afresh on each call because every shutdown replaces it; None if this Ray has none.

    ``ray.shutdown()`` (also at interpreter exit) calls ``teardown(kill_actors=True)`` on
    each entry first, while Ray is still up, then replaces the registry with a fresh one.
    Ray has no public shutdown hook; this is the mechanism Ray uses for its own compiled
    graphs, so cgc's graphs end exactly where Ray's do.

    Example: ``compiled_dag_registry()[dag.get_id()] = dag``.

    Raises:
        Nothing; a Ray without it gives None and one warning.
    """
    try:
        return _resolve(_CDN, "_compiled_dags")
    except (ImportError, AttributeError):
        if _CDN not in _warned:
            _warned.add(_CDN)
            log.warning("cgc: Ray %s has no %s._compiled_dags (cgc was written for Ray %s): "
                        "ray.shutdown() will not tear cgc's graphs down first; tear them "
                        "down before shutting Ray down", installed_version(), _CDN,
                        WRITTEN_FOR)
        return None


def executable_task_record() -> Any:
    """Ray's profiling record class (a dataclass: ``actor_classname``, ``actor_name``,
    ``actor_id``, ``method_name``, ``bind_index``, ``operation``, ``start_t``, ``end_t``).

    Example: ``executable_task_record()(actor_classname="A", ..., end_t=1.0)``.

    Raises:
        cgc.runtime.errors.SetupError: this Ray has none (profiling cannot run as Ray's).
    """
    try:
        return _resolve(_CDN, "_ExecutableTaskRecord")
    except (ImportError, AttributeError):
        from cgc.runtime.errors import SetupError

        raise SetupError(f"RAY_CGRAPH_ENABLE_PROFILING: Ray {installed_version()} has no "
                         f"{_CDN}._ExecutableTaskRecord (cgc was written for Ray "
                         f"{WRITTEN_FOR}); use start(trace=...) instead") from None


# ------------------------------------------------------------------------- the drop-in's refs
@dataclass(frozen=True)
class RefFields:
    """What a ``CompiledDAGRef``/``CompiledDAGFuture`` holds under Ray's names."""

    dag: Any
    execution_index: int
    channel_index: int | None


def init_ref(ref: Any, dag: Any, execution_index: int, channel_index: int | None) -> None:
    """Fill in the fields Ray's ``__init__`` would set on a subclass of Ray's
    ``CompiledDAGRef`` or ``CompiledDAGFuture`` whose ``__init__`` skips Ray's (it reads
    Ray's channels): the graph, the execution and output indices, and the "fetched" flag
    (a ref) or the pending future (a future: None, cgc awaits its own).

    Example: ``init_ref(self, compiled_dag, 3, None)`` in ``CgcDAGRef.__init__``.

    Raises:
        Nothing.
    """
    ref._dag = dag
    ref._execution_index = execution_index
    ref._channel_index = channel_index
    if isinstance(ref, _import(_REF, "CompiledDAGFuture")):
        ref._fut = None
    else:
        ref._ray_get_called = False


def note_fetched(ref: Any) -> None:
    """Set Ray's "fetched" flag of a ``CompiledDAGRef`` (its ``get`` was called).

    Raises:
        Nothing.
    """
    ref._ray_get_called = True


def ref_fields(ref: Any) -> RefFields:
    """The graph and indices a ref filled by ``init_ref`` holds.

    Raises:
        RayVersionError: ``ref`` lacks them (it was not filled by ``init_ref``).
    """
    return RefFields(_get(ref, "_dag"), _get(ref, "_execution_index"),
                     _get(ref, "_channel_index"))


