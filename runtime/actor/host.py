"""The actor side of a plan actor: ``ActorHost`` builds the user's class inside the actor.

The driver (``cgc.runtime.driver.plan_actors``) picks the Ray actor class; when the user's
class can only be built inside the actor (embedded model source, or a module only the
actors can import), that class is an ``ActorHost`` subclass named like the user's class
(``host_class``). ``user_object(self)`` is how code running in the actor (``__ray_call__``)
finds the object whose methods the plan calls, host or not.

Example::

    ray.remote(host_class("Stage")).remote(actor_bytes, module_bytes)   # in the driver
    user_object(self).forward(x)                                       # in the actor
"""

from __future__ import annotations

import importlib
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.values import decode_value
from cgc.runtime.embedded import plan_modules, register
from cgc.runtime.ray_internals import remote_class

__all__ = ["ActorHost", "ClassMismatchError", "ctor_arguments", "host_class", "load_class",
           "unwrap_class", "user_object"]

_INSTANCE_ATTR = "_cgc_instance_"


def user_object(actor_self: Any) -> Any:
    """The user's object inside an actor: the host's instance, or the actor itself."""
    return getattr(actor_self, _INSTANCE_ATTR, actor_self)


def unwrap_class(obj: Any) -> Any:
    """The user's class behind ``@cgc.actor`` / ``@ray.remote`` (``obj`` itself otherwise)."""
    # @cgc.actor returns a wrapper around the plain class; __wrapped__ is the class.
    # @ray.remote returns an ActorClass; the user's class sits in its metadata.
    cls = remote_class(obj)
    return cls if cls is not obj else getattr(obj, "__wrapped__", obj)


def ctor_arguments(actor: pb.Actor) -> tuple[list[Any], dict[str, Any]]:
    """The actor's constructor arguments, decoded (pickled ones are unpickled: call only
    after the plan's trust gate).

    Example: ``ctor_arguments(plan.graph.actors[0]) == ([], {})`` for ``Echo.bind()``.

    Raises:
        ValueDecodeError: a value cannot be decoded (named: ``actor w0 ctor_args[1]``).
    """
    what = f"actor {actor.name}"
    args = [decode_value(v, f"{what} ctor_args[{i}]") for i, v in enumerate(actor.ctor_args)]
    kwargs = {nv.name: decode_value(nv.value, f"{what} ctor_kwargs[{nv.name!r}]")
              for nv in actor.ctor_kwargs}
    return args, kwargs


class ClassMismatchError(ImportError):
    """A plan's class name leads to something other than a class defined where it says."""


def load_class(module: str, qualname: str, source: str = "", source_file: str = "") -> type:
    """Import ``module`` (or build it from ``source``) and return the class ``qualname``
    defined in it.

    The object found must be a class whose own ``__module__`` and ``__qualname__`` are the
    ones asked for. Why: the trust rules vouch for a plan by the modules its classes come
    from, and ``mypkg`` + ``subprocess.Popen`` would otherwise reach ``subprocess``
    through ``mypkg``'s imports.

    Raises:
        ImportError: the module or the class is not there.
        ClassMismatchError: the name leads to something that is not a class defined there.
    """
    if source:
        register({module: (source, source_file or f"<cgc {module}>")})
    mod = importlib.import_module(module)
    obj: Any = mod
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{module} has no {qualname}") from None
    cls = unwrap_class(obj)
    if not isinstance(cls, type):
        raise ClassMismatchError(f"{module}.{qualname} is a {type(cls).__name__}, not a class")
    home = (getattr(cls, "__module__", None), getattr(cls, "__qualname__", None))
    if home != (module, qualname):
        raise ClassMismatchError(f"{module}.{qualname} is the class {home[0]}.{home[1]}, defined in "
                          f"another module than the plan names")
    return cls


class ActorHost:
    """A Ray actor that builds the user's class inside its own process and holds the object.

    ``ctor`` is a serialized ``pb.Actor`` (only its class and constructor args are used) so
    pickled constructor args are decoded after the module they may refer to exists.
    """

    def __init__(self, actor_bytes: bytes, module_bytes: bytes = b"",
                 other_modules: bytes = b"") -> None:
        actor = pb.Actor.FromString(actor_bytes)
        # The plan's other modules first (the model's sibling helpers.py): the class's
        # module may import them while it loads.
        register(plan_modules(pb.Plan(graph=pb.Graph.FromString(other_modules))))
        source = file = ""
        if module_bytes:
            embedded = pb.EmbeddedModule.FromString(module_bytes)
            source, file = embedded.source, embedded.source_file
        cls = load_class(actor.cls.module, actor.cls.qualname, source, file)
        args, kwargs = ctor_arguments(actor)
        setattr(self, _INSTANCE_ATTR, cls(*args, **kwargs))

    def __repr__(self) -> str:
        # Ray prints repr(actor) as the actor's log prefix and records it as its repr name:
        # show what a plain ray.remote(cls) actor would, the user's repr if the class has
        # one, else the class name.
        inst = getattr(self, _INSTANCE_ATTR, None)
        cls: Any = type(inst)  # Any: mypy sees a bound __repr__ here, not the function
        if inst is not None and cls.__repr__ is not object.__repr__:
            return repr(inst)
        return type(self).__name__


def host_class(qualname: str) -> type:
    """An ``ActorHost`` subclass named like the user's class ``qualname``.

    Why: Ray takes an actor's class name (state API, dashboard), process title
    (``ray::<name>``) and log prefix from the ``__qualname__``/``__name__`` of the class it
    was given, and the host only learns the user's class inside the actor.

    Example: ``ray.remote(host_class("Stage"))`` shows up in ``ray list actors`` as ``Stage``.
    """
    hit = _host_classes.get(qualname)
    if hit is None:
        attrs = {"__qualname__": qualname, "__module__": ActorHost.__module__,
                 "__doc__": f"cgc's host for the user class {qualname}."}
        hit = _host_classes[qualname] = type(qualname.rsplit(".", 1)[-1], (ActorHost,), attrs)
    return hit


_host_classes: dict[str, type] = {}
