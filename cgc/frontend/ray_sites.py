"""Source lines for Ray DAG nodes: ``record_ray_bind_sites()``.

Ray's DAG nodes do not remember where they were made. While this context manager is
active it wraps Ray's node constructor and ``with_tensor_transport`` to note the creating
user frame in weak dictionaries (so nothing is kept alive), and it fills two gaps that
keep a Ray Compiled Graph model from compiling unchanged once ``Actor.remote()`` becomes
``Actor.bind()``: multi-return methods bound on a ``ClassNode`` return one placeholder per
output (as they do on live handles), and ``ray.experimental.collective`` ops accept nodes
of ``ClassNode`` actors. Everything is restored on exit, so Ray is left untouched. What is
patched is listed in ``ray_private`` (``PATCH_*``), with every other use of Ray's internals.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from cgc.frontend import ray_private as rp
from cgc.frontend.locations import RawLoc, loc_of_frame
from cgc.frontend.unused_actors import note_bound

__all__ = ["record_ray_bind_sites", "NODE_SITES", "HINT_SITES"]

# Ray DAG node -> where the user created it / last called with_tensor_transport on it.
NODE_SITES: weakref.WeakKeyDictionary[Any, RawLoc] = weakref.WeakKeyDictionary()
HINT_SITES: weakref.WeakKeyDictionary[Any, RawLoc] = weakref.WeakKeyDictionary()

_LOCK = threading.Lock()


def _note(table: weakref.WeakKeyDictionary, node: Any) -> None:
    try:
        table[node] = loc_of_frame(sys._getframe(2))
    except TypeError:
        pass  # not weak-referenceable: simply no source line for it


def _patches() -> dict[str, list[tuple[rp.PatchTarget, Any]]]:
    """module -> [(target, make_wrapper(original))] to apply while recording."""

    def init(orig: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            _note(NODE_SITES, self)
            if type(self).__name__ == "ClassNode":  # Cls.bind(): for the unused-actor warning
                loc = NODE_SITES.get(self)
                if loc is not None:
                    cls = getattr(rp.original_class(rp.actor_body(self)), "__qualname__", "?")
                    note_bound(self, cls, loc.file, loc.line)

        return __init__

    def hint(orig: Any) -> Any:
        def with_tensor_transport(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig(self, *args, **kwargs)
            _note(HINT_SITES, self)
            return out

        return with_tensor_transport

    def bind(orig: Any) -> Any:
        def bind(self: Any, *args: Any, **kwargs: Any) -> Any:
            from cgc.frontend.ray_graph import class_node_placeholders

            return class_node_placeholders(self, orig(self, *args, **kwargs))

        return bind

    def coll(orig: Any) -> Any:
        def _bind(inputs: Any, op: Any, transport: Any = None) -> Any:
            from cgc.frontend.ray_graph import class_node_collective

            out = class_node_collective(inputs, op, transport)
            return out if out is not None else orig(inputs, op, transport)

        return _bind

    table: dict[str, list[tuple[rp.PatchTarget, Any]]] = {}
    for target, make in (
        (rp.PATCH_NODE_INIT, init),
        (rp.PATCH_TENSOR_TRANSPORT, hint),
        (rp.PATCH_CLASS_METHOD_BIND, bind),
        (rp.PATCH_COLLECTIVE_BIND, coll),
    ):
        table.setdefault(target.module, []).append((target, make))
    return table


class _Patcher(importlib.abc.MetaPathFinder):
    """Applies the patches to modules loaded now or later (Ray is never imported by us)."""

    def __init__(self) -> None:
        self.table = _patches()
        self.undo: list[tuple[Any, str, Any]] = []

    def apply(self, module: Any) -> None:
        """Patch ``module``'s targets.

        Raises:
            RayVersionError: a target is missing (nothing of this module is patched).
        """
        targets = self.table.get(module.__name__, [])
        found = [(t, make, *rp.patch_original(t, module)) for t, make in targets]
        for target, make, owner, orig in found:
            self.undo.append((owner, target.attr, orig))
            setattr(owner, target.attr, make(orig))

    def restore(self) -> None:
        for owner, attr, orig in reversed(self.undo):
            setattr(owner, attr, orig)
        self.undo.clear()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.table:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader, patcher = spec.loader, self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                # Hand the real loader back first: the module keeps no trace of us.
                module.__loader__ = loader
                if module.__spec__ is not None:
                    module.__spec__.loader = loader
                loader.exec_module(module)
                patcher.apply(module)

        spec.loader = _Loader()
        return spec


@contextlib.contextmanager
def record_ray_bind_sites() -> Iterator[None]:
    """Note where Ray DAG nodes are created while the block runs.

    Does not import Ray: modules of Ray that are already loaded are patched at once, the
    others when the block imports them. On exit everything is restored.

    Example::

        with record_ray_bind_sites():
            dag = build_dag()          # a model written with ray.dag
        graph = trace(dag).graph       # nodes carry model.py:LINE

    Raises:
        RayVersionError: a function it patches is missing from the installed Ray (when
            entering, or when the block imports that part of Ray); Ray is left unpatched.
        Exceptions of the block propagate after Ray is restored.
    """
    patcher = _Patcher()
    with _LOCK:
        try:
            for name in patcher.table:
                if name in sys.modules:
                    patcher.apply(sys.modules[name])
        except BaseException:
            patcher.restore()
            raise
        sys.meta_path.insert(0, patcher)
    try:
        yield
    finally:
        with _LOCK:
            if patcher in sys.meta_path:
                sys.meta_path.remove(patcher)
            patcher.restore()
