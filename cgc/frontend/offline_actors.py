"""A model file's ``Cls.remote()`` compiled offline: the plan's own actor, no cluster.

``cgc compile model.py:step`` imports the model with no Ray running. While it does,
``ActorClass._remote`` (what ``Cls.remote()`` and ``Cls.options(...).remote()`` call) gives
an ``OfflineActor`` instead of starting Ray and an actor: it holds Ray's ``ClassNode``
(what ``Cls.bind()`` gives, with the same options), so the plan creates the actor as it
does for ``Cls.bind()``. In a traced step, ``actor.m.remote(...)`` (and
``actor.m.options(...).remote(...)``) records a call on it; ``actor.m.bind(...)`` builds
Ray's DAG as on a ``ClassNode``. Outside a trace its calls cannot run and say so.

Example (a model file)::

    stage0 = Stage.remote(0)          # offline: a plan actor
    def step(x):
        return stage0.fwd.remote(x)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from cgc.errors import CompileError
from cgc.frontend import ray_private as rp
from cgc.frontend.locations import RawLoc, capture_loc

__all__ = ["OfflineActor", "offline_actors"]


class OfflineActor:
    """``Cls.remote(...)`` of a model file compiled offline (a plan actor)."""

    def __init__(self, class_node: Any, loc: RawLoc) -> None:
        self._cgc_class_node = class_node
        self._cgc_loc = loc

    def __getattr__(self, name: str) -> OfflineMethod:
        if name.startswith("__") or name.startswith("_cgc_"):
            raise AttributeError(name)
        return OfflineMethod(self, name, {})

    def __repr__(self) -> str:
        body = rp.actor_body(self._cgc_class_node)
        return (f"<offline actor {getattr(body, '__qualname__', '?')} made at "
                f"{self._cgc_loc.short()} (a plan actor: cgc compile runs no Ray)>")


class OfflineMethod:
    """``offline_actor.m``: ``.remote`` inside a traced step, ``.bind`` for Ray's DAG."""

    def __init__(self, owner: OfflineActor, name: str, options: dict[str, Any]) -> None:
        self._owner = owner
        self._name = name
        self._options = options

    def options(self, **options: Any) -> OfflineMethod:
        """Per-call options, as Ray's ``actor.m.options(num_returns=, tensor_transport=)``.

        Raises:
            ValueError: an unknown tensor transport (Ray's check).
        """
        if options.get("tensor_transport") is not None:
            from ray.experimental.rdt.util import normalize_and_validate_tensor_transport

            options["tensor_transport"] = normalize_and_validate_tensor_transport(
                options["tensor_transport"])
        return OfflineMethod(self._owner, self._name, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Record a call in the step being traced.

        Raises:
            CompileError: no step is being traced (an offline actor runs nothing).
        """
        from cgc.frontend.step_tracer import current_session

        session = current_session()
        if session is None:
            loc = capture_loc()
            raise CompileError(
                f"{loc.short()}: {self._name}.remote() on an actor made offline at "
                f"{self._owner._cgc_loc.short()}: cgc compile imports the model without Ray, "
                "so Cls.remote() is a plan actor and its calls run only as part of a traced "
                "step (cgc compile model.py:step)", method=self._name, loc=loc.short())
        return session.offline_call(self._owner, self._name, args, kwargs, self._options)

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """Ray's ``.bind()`` on the actor's ``ClassNode`` (a Ray DAG, as ``Cls.bind()``)."""
        method = getattr(self._owner._cgc_class_node, self._name)
        if self._options:
            method = method.options(**self._options)
        return method.bind(*args, **kwargs)


def _actor_remote(orig: Any) -> Any:
    def _remote(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        loc = capture_loc()
        node = self.options(**options).bind(*(args or ()), **(kwargs or {}))
        return OfflineActor(node, loc)

    return _remote


@contextlib.contextmanager
def offline_actors(source: str) -> Iterator[bool]:
    """While a model file (``source``) is imported with no Ray running, its
    ``Cls.remote()`` makes plan actors. Yields whether it is in effect: only when the
    source calls ``.remote(`` at all (so cgc-only models never import Ray) and Ray is not
    initialized (with a cluster at hand, ``Cls.remote()`` stays Ray's live actor).

    Example::

        with offline_actors(path.read_text()):
            model = load_model_file(path)

    Raises:
        RayVersionError: this Ray has no ``ActorClass._remote``.
    """
    if ".remote(" not in source:
        yield False
        return
    import ray
    import ray.actor

    if ray.is_initialized():
        yield False
        return
    owner, orig = rp.patch_original(rp.PATCH_ACTOR_REMOTE, sys.modules["ray.actor"])
    setattr(owner, rp.PATCH_ACTOR_REMOTE.attr, _actor_remote(orig))
    try:
        yield True
    finally:
        setattr(owner, rp.PATCH_ACTOR_REMOTE.attr, orig)
