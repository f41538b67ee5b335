"""Creating the plan's actors (or binding existing ones), in the driver.

Three ways to get an actor class:

1. the in-process side table (``cgc.compile(dag)`` passes the classes): ``ray.remote(cls)``;
2. a class carried by value (``ClassRef.pickled_class``: a class of a script's, a
   notebook's or ``python -c``'s ``__main__``) unpickled on the driver, after the trust
   gate: the same (Ray then ships it to its actor by value too, never by re-running the
   script);
3. ``ClassRef.module``/``qualname`` importable on the driver: the same;
4. otherwise (embedded model source, or a module only the actors can import): the actor is
   an ``ActorHost`` that builds the module *inside the actor process* (``__name__`` is
   ``ClassRef.module``, never ``"__main__"``) and holds the user object. The Ray actor class
   is a subclass made for that user class and named like it (``host_class``), so Ray shows
   the user's class everywhere it shows a class: ``ray list actors``, the dashboard, the
   process title ``ray::Stage`` and the log prefix ``(Stage pid=...)``.

Every actor the plan creates gets a Ray actor name that says which plan and which of its
actors it is, ``"<plan>.<actor>@<graph id>"`` (``pipeline.stage0@3f2a9c1b``), unless the
user named it; the graph id keeps two running graphs of one plan from clashing. Existing
actors the plan binds to are never renamed.

Example::

    handles, created = make_actors(plan, drop_gpus=True)
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.actor.host import (
    ClassMismatchError,
    ctor_arguments,
    host_class,
    load_class,
    unwrap_class,
)
from cgc.runtime.errors import SetupError
from cgc.runtime.ray_internals import handle_id

__all__ = ["make_actors", "ray_actor_name"]

def ray_actor_name(plan_name: str, actor: str, graph_id: str) -> str:
    """The Ray actor name of a plan actor the user did not name.

    Example: ``ray_actor_name("pipeline", "stage0", "3f2a9c1b") == "pipeline.stage0@3f2a9c1b"``.
    """
    return f"{plan_name or 'cgc'}.{actor}@{graph_id}"


_remote_cache: dict[int, Any] = {}


def _remote_class(obj: Any) -> Any:
    import ray
    from ray.actor import ActorClass

    if isinstance(obj, ActorClass):
        return obj
    key = id(obj)
    hit = _remote_cache.get(key)
    if hit is None or hit[0] is not obj:
        hit = (obj, ray.remote(obj))
        _remote_cache[key] = hit
    return hit[1]


def _options(actor: pb.Actor, drop_gpus: bool) -> dict[str, Any]:
    o = actor.options
    out: dict[str, Any] = {}
    if o.HasField("num_cpus"):
        out["num_cpus"] = o.num_cpus
    if o.HasField("num_gpus") and not drop_gpus:
        out["num_gpus"] = o.num_gpus
    if o.HasField("memory"):
        out["memory"] = o.memory
    if o.resources:
        out["resources"] = {r.name: r.amount for r in o.resources}
    if o.runtime_env_json:
        out["runtime_env"] = json.loads(o.runtime_env_json)
    if o.HasField("max_concurrency"):
        out["max_concurrency"] = o.max_concurrency
    if o.actor_name:
        out["name"] = o.actor_name
    if o.namespace:
        out["namespace"] = o.namespace
    return out


def _bind_external(plan: Any, actor: pb.Actor) -> Any:
    import ray

    handle = plan.live_handles.get(actor.name)
    if handle is None and actor.external.actor_id:
        for h in plan.live_handles.values():
            if handle_id(h) == actor.external.actor_id:
                handle = h
    if handle is not None:
        return handle
    ext = actor.external
    if ext.name:
        try:
            return ray.get_actor(ext.name, namespace=ext.namespace or None)
        except ValueError:
            pass
    what = f"named {ext.name!r}" + (f" in namespace {ext.namespace!r}" if ext.namespace else "")
    if not ext.name:
        what = f"with id {ext.actor_id} (a live handle given to cgc.compile in another process)"
    raise SetupError(
        f"actor {actor.name} is an existing actor {what}, but no such actor is alive; "
        "start it first, or compile the plan with a named actor"
    )


def _module_hidden_from_workers(cls: Any) -> Any:
    """The class's module when Ray's workers could not import it, else None.

    Why: Ray pickles classes by reference, and its workers see only site-packages,
    PYTHONPATH, the driver's working directory and script directory. A class from a module
    found through another path (a test directory, a notebook's sys.path tweak) is then
    shipped by value instead, the way Ray Serve does it.
    """
    import site

    cls = unwrap_class(cls)
    name = getattr(cls, "__module__", "__main__")
    mod = sys.modules.get(name)
    if mod is None or name == "__main__" or not getattr(mod, "__file__", None):
        return None
    top = sys.modules.get(name.split(".")[0])
    top_file = getattr(top, "__file__", None) or mod.__file__
    root = os.path.dirname(os.path.abspath(str(top_file)))
    if hasattr(top, "__path__"):  # a package: its parent directory is the sys.path entry
        root = os.path.dirname(root)
    visible = [os.getcwd(), os.path.dirname(os.path.abspath(sys.argv[0] or "."))]
    visible += site.getsitepackages() + [site.getusersitepackages()]
    visible += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    visible += [os.path.dirname(os.__file__)]  # the standard library
    if root in {os.path.abspath(v) for v in visible}:  # the sys.path entry itself
        return None
    if name.split(".")[0] == "cgc":
        return None
    return mod


def _unpickle_class(actor: pb.Actor, cloudpickle: Any) -> Any:
    """The class a plan carries by value (only called after the plan's trust gate)."""
    try:
        cls = cloudpickle.loads(actor.cls.pickled_class)
    except Exception as exc:  # noqa: BLE001 - whatever unpickling raises: name the actor
        raise SetupError(
            f"actor {actor.name}: its class {actor.cls.qualname} (carried by value) cannot "
            f"be unpickled here: {type(exc).__name__}: {exc}") from exc
    if not isinstance(unwrap_class(cls), type):
        raise SetupError(f"actor {actor.name}: the pickled class {actor.cls.qualname} "
                         f"unpickled to a {type(cls).__name__}, not a class")
    return cls


def make_actors(
    plan: Any, drop_gpus: bool, graph_id: str = ""
) -> tuple[dict[str, Any], set[str]]:
    """Create or bind every actor of ``plan`` (a ``cgc.runtime.Plan``), in plan order.

    Returns ``(handles by actor name, names of the actors created here)``. Creation is
    asynchronous in Ray; the first call on each handle waits for it. Created actors the
    user did not name are named ``ray_actor_name(plan name, actor, graph_id)``; without a
    ``graph_id`` a random one is drawn.

    Raises:
        SetupError: an external actor is not alive, or an actor class cannot be resolved.
    """
    from ray import cloudpickle

    handles: dict[str, Any] = {}
    created: set[str] = set()
    graph_id = graph_id or uuid.uuid4().hex[:8]
    embedded_modules = {m.name: m for m in plan.proto.graph.modules}
    other_modules = pb.Graph(modules=plan.proto.graph.modules).SerializeToString()
    for actor in plan.proto.graph.actors:
        if actor.external.name or actor.external.actor_id:
            handles[actor.name] = _bind_external(plan, actor)
            continue
        opts = _options(actor, drop_gpus)
        opts.setdefault("name", ray_actor_name(plan.proto.name, actor.name, graph_id))
        cls = plan.classes.get(actor.name)
        if cls is None and actor.cls.pickled_class:
            cls = _unpickle_class(actor, cloudpickle)
        embedded = embedded_modules.get(actor.cls.module)
        if cls is None and embedded is None:
            try:
                cls = load_class(actor.cls.module, actor.cls.qualname)
            except ClassMismatchError as exc:
                raise SetupError(f"actor {actor.name}: {exc}") from None
            except Exception:  # noqa: BLE001 - maybe only importable on the actors
                cls = None
        if cls is not None:
            args, kwargs = ctor_arguments(actor)
            rc = _remote_class(unwrap_class(cls))
        else:
            module_bytes = embedded.SerializeToString() if embedded is not None else b""
            args, kwargs = [actor.SerializeToString(), module_bytes, other_modules], {}
            rc = _remote_class(host_class(actor.cls.qualname))
        by_value = _module_hidden_from_workers(cls) if cls is not None else None
        if by_value is not None and by_value.__name__ in \
                cloudpickle.list_registry_pickle_by_value():
            by_value = None  # the user ships it by value already: theirs to unregister
        try:
            if by_value is not None:  # Ray pickles the class when the actor is created
                cloudpickle.register_pickle_by_value(by_value)
            handles[actor.name] = rc.options(**opts).remote(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - bad options: name the actor
            raise SetupError(f"cannot create actor {actor.name}: {exc}") from exc
        finally:
            if by_value is not None:
                cloudpickle.unregister_pickle_by_value(by_value)
        created.add(actor.name)
    return handles, created
