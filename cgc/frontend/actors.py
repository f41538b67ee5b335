"""``@cgc.actor`` classes, lazy actors (``Cls.bind(...)``) and ``@cgc.method``.

A decorated class stays usable as a normal class (calling it makes an instance; the
original is ``Cls.cls``). ``Cls.bind(*args, **kwargs)`` makes a ``LazyActor``: an actor
the plan will create, with these constructor arguments and options. Its methods are bound
with ``lazy.method.bind(...)`` into ``CallNode``s.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from cgc.errors import CompileError
from cgc.frontend.locations import RawLoc, capture_loc
from cgc.frontend.nodes import CallNode
from cgc.frontend.ray_private import declared_num_returns as ray_num_returns_mark
from cgc.frontend.unused_actors import note_bound

__all__ = ["actor", "method", "ActorClass", "LazyActor", "BoundMethod", "ACTOR_OPTIONS"]

# The actor options a plan can carry (pb.ActorOptions).
ACTOR_OPTIONS = (
    "num_cpus",
    "num_gpus",
    "memory",
    "resources",
    "runtime_env",
    "max_concurrency",
    "name",
    "namespace",
)

# cgc's own actor options (kept in the plan's nodes, never handed to Ray).
CGC_OPTIONS = ("cuda_graph",)

_ACTOR_SEQ = itertools.count()


@dataclass(frozen=True)
class ExternalSpec:
    """A live actor the plan binds to instead of creating one."""

    handle: Any
    actor_id: str
    name: str = ""
    namespace: str = ""
    # What it holds, read from the actor when the graph is compiled (live_actors.observe).
    placement: Any = None


def _check_options(options: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(options) - set(ACTOR_OPTIONS) - set(CGC_OPTIONS))
    if unknown:
        raise TypeError(
            f"{where}: unknown actor option(s) {', '.join(unknown)}; "
            f"cgc actors take {', '.join(ACTOR_OPTIONS + CGC_OPTIONS)}"
        )
    if not isinstance(options.get("cuda_graph", False), bool):
        raise TypeError(f"{where}: cuda_graph must be True or False, got "
                        f"{options['cuda_graph']!r}")
    return dict(options)


def method(_func: Any = None, *, num_returns: int = 1, cuda_graph: bool = False) -> Any:
    """Declare a method's number of return values, like ``@ray.method(num_returns=k)``, and
    whether the actor replays it as a CUDA graph.

    ``cuda_graph=True``: after its first executions the actor captures the call once and
    replays the capture in later executions (``cgc.runtime.gpu.cuda_graphs``). The method must
    then be a function of its tensor arguments and the actor's device tensors: no host
    synchronisation, no Python state that changes between calls, same non-tensor arguments
    per captured variant. Calls it cannot capture run eagerly, and that is reported.

    Example::

        @cgc.actor
        class Worker:
            @cgc.method(num_returns=2)
            def split(self, x):
                return x[:1], x[1:]

            @cgc.method(cuda_graph=True)
            def step(self, x):
                return self.net(x)

    Raises:
        TypeError: ``num_returns`` is not a positive int, or ``cuda_graph`` not a bool.
    """
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns < 1:
        raise TypeError(f"num_returns must be a positive int, got {num_returns!r}")
    if not isinstance(cuda_graph, bool):
        raise TypeError(f"cuda_graph must be True or False, got {cuda_graph!r}")

    def deco(func: Any) -> Any:
        func.__cgc_num_returns__ = num_returns
        if cuda_graph:
            func.__cgc_cuda_graph__ = True
        return func

    return deco(_func) if _func is not None else deco


def declared_num_returns(cls: type, name: str) -> int | None:
    """``num_returns`` declared with ``@cgc.method`` or ``@ray.method``, else None."""
    func = getattr(cls, name, None)
    for value in (getattr(func, "__cgc_num_returns__", None), ray_num_returns_mark(func)):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def declared_cuda_graph(cls: type | None, name: str) -> bool:
    """Whether ``cls.name`` is marked ``@cgc.method(cuda_graph=True)``."""
    return cls is not None and getattr(getattr(cls, name, None), "__cgc_cuda_graph__",
                                       False) is True


class ActorClass:
    """A class decorated with ``@cgc.actor``; ``.bind(...)`` makes a lazy actor."""

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self.cls = cls
        self._options = options
        self.__doc__ = cls.__doc__
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__wrapped__ = cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls(*args, **kwargs)  # still a normal class: make a local instance

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)

    def __repr__(self) -> str:
        return f"<cgc actor class {self.cls.__module__}.{self.cls.__qualname__}>"

    def bind(self, *args: Any, **kwargs: Any) -> LazyActor:
        """A lazy actor of this class, made with these constructor arguments.

        Example: ``w = Worker.bind(0, lr=0.1)``.

        Raises:
            CompileError: (when traced) the arguments do not fit ``__init__``.
        """
        return _noted(LazyActor(self.cls, args, kwargs, dict(self._options), capture_loc()))

    def options(self, **options: Any) -> _OptionedActorClass:
        """Override this class's actor options for the next ``.bind``.

        Example: ``Worker.options(num_gpus=1, name="w0").bind()``.

        Raises:
            TypeError: an option cgc plans cannot carry.
        """
        merged = dict(self._options)
        merged.update(_check_options(options, f"{self.cls.__qualname__}.options"))
        return _OptionedActorClass(self, merged)


class _OptionedActorClass:
    def __init__(self, owner: ActorClass, options: dict[str, Any]) -> None:
        self._owner = owner
        self._options = options

    def bind(self, *args: Any, **kwargs: Any) -> LazyActor:
        return _noted(LazyActor(self._owner.cls, args, kwargs, dict(self._options),
                                capture_loc()))


def actor(_cls: type | None = None, **options: Any) -> Any:
    """Make a class a cgc actor class: ``@cgc.actor`` or ``@cgc.actor(num_gpus=1, ...)``.

    Options: num_cpus, num_gpus, memory, resources (dict), runtime_env (dict),
    max_concurrency, name, namespace (as in ``@ray.remote``); and cgc's own
    ``cuda_graph=True``: every method of the actor is replayed as a CUDA graph (see
    ``cgc.method``).

    Example::

        @cgc.actor(num_cpus=1)
        class Worker:
            def fwd(self, x):
                return x + 1

        w = Worker.bind()

    Raises:
        TypeError: not a class, or an unknown option.
    """

    def deco(cls: type) -> ActorClass:
        if not isinstance(cls, type):
            raise TypeError(f"@cgc.actor decorates classes, not {type(cls).__name__}")
        return ActorClass(cls, _check_options(options, f"@cgc.actor on {cls.__qualname__}"))

    return deco(_cls) if _cls is not None else deco


def _noted(actor: LazyActor) -> LazyActor:
    """``actor``, recorded for the unused-actor warning (``cgc.frontend.unused_actors``)."""
    note_bound(actor, actor.class_qualname, actor._loc.file, actor._loc.line)
    return actor


class LazyActor:
    """An actor the plan will create (or, when ``external`` is set, an existing one)."""

    def __init__(
        self,
        cls: type | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        loc: RawLoc,
        *,
        external: ExternalSpec | None = None,
        class_module: str = "",
        class_qualname: str = "",
    ) -> None:
        self.cls = cls
        self.ctor_args = tuple(args)
        self.ctor_kwargs = dict(kwargs)
        self.options = options
        self._loc = loc
        self._seq = next(_ACTOR_SEQ)
        self.external = external
        # When the class object is not at hand (a live handle of an unimportable class).
        self.class_module = class_module or (cls.__module__ if cls is not None else "")
        self.class_qualname = class_qualname or (cls.__qualname__ if cls is not None else "")
        self._calls: list[Any] = []

    def _register_call(self, node: Any) -> int:
        self._calls.append(node)
        return len(self._calls) - 1

    def __getattr__(self, name: str) -> BoundMethod:
        if name.startswith("__"):
            raise AttributeError(name)
        return BoundMethod(self, name, {})

    def _describe(self) -> str:
        return self.class_qualname.rsplit(".", 1)[-1] or "actor"

    def __repr__(self) -> str:
        return f"<cgc lazy actor {self.class_qualname} bound at {self._loc.short()}>"


class BoundMethod:
    """``lazy_actor.method``: ``.bind(...)`` makes a call node."""

    def __init__(self, actor: LazyActor, name: str, options: dict[str, Any]) -> None:
        self._actor = actor
        self._name = name
        self._options = options

    def options(self, *, num_returns: int | None = None) -> BoundMethod:
        """Per-call options, like Ray's: ``w.split.options(num_returns=2).bind(x)``.

        Raises:
            TypeError: ``num_returns`` is not a positive int.
        """
        if num_returns is not None and (
            isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns < 1
        ):
            raise TypeError(f"num_returns must be a positive int, got {num_returns!r}")
        return BoundMethod(self._actor, self._name, {"num_returns": num_returns})

    def bind(self, *args: Any, **kwargs: Any) -> CallNode:
        """Bind a call of this method; args and kwargs may be nodes or constants.

        A call with ``num_returns=k > 1`` can be unpacked (``a, b = w.split.bind(x)``) or
        indexed (``node[1]``).

        Example: ``y = w.fwd.bind(inp[0], scale=2.0)``.

        Raises:
            CompileError: (when traced) unknown method or arguments that do not bind.
        """
        num_returns = self._options.get("num_returns")
        if num_returns is None and self._actor.cls is not None:
            num_returns = declared_num_returns(self._actor.cls, self._name)
        return CallNode(self._actor, self._name, args, kwargs, num_returns or 1)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise CompileError(
            f"{capture_loc().short()}: {self._actor._describe()}.{self._name}(...) called "
            f"directly; in a graph write {self._name}.bind(...)",
            method=self._name,
        )
