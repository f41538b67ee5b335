"""Per-node and per-actor checks at trace time: one node or one actor at a time.

This is the home of every check that needs the final names (so it runs while tracing) but
looks at one thing only: a call's method and bound arguments, a constant, a transport
hint, an actor's constructor arguments, class and options. Checks that need the whole
graph live in ``graph_checks``; the overview of where a new check goes is in
``cgc.frontend``'s docstring.

Each check gets the tracer's ``Names``, which knows the final node and actor names and
renders the user's source line, so every message reads
``model.py:14: w1.fwd#2 (Worker.fwd): <what is wrong>; <how to fix it>``.
"""

from __future__ import annotations

import difflib
import inspect
import os
from types import ModuleType
from typing import Any

from cgc.frontend import ray_private
from cgc.frontend.actor_proto import class_ref, options_proto
from cgc.frontend.nodes import HintSpec
from cgc.frontend.reporter import Names
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.values import DTYPE_BYTES, ValueEncodeError, encode_value

__all__ = [
    "check_method",
    "check_ctor",
    "hint_to_proto",
    "encode_constant",
    "actor_class",
    "actor_options",
    "method_names",
]


def method_names(cls: type) -> list[str]:
    """Callable attributes of ``cls`` other than dunders (the methods a graph may bind).

    >>> class Worker:
    ...     def fwd(self, x): ...
    ...     def _helper(self): ...
    >>> method_names(Worker)
    ['_helper', 'fwd']

    Raises:
        Nothing.
    """
    names = []
    for name in dir(cls):
        if name.startswith("__"):
            continue
        if callable(inspect.getattr_static(cls, name, None)) or isinstance(
            inspect.getattr_static(cls, name, None), (staticmethod, classmethod)
        ):
            names.append(name)
    return sorted(names)


def _signature(cls: type, name: str) -> inspect.Signature | None:
    """The method's signature as callers see it (no ``self``), or None if unknown."""
    raw = inspect.getattr_static(cls, name, None)
    func = getattr(cls, name, None)
    if func is None:
        return None
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None  # builtins and C extensions: nothing to check against
    params = list(sig.parameters.values())
    if not isinstance(raw, (staticmethod, classmethod)) and params:
        params = params[1:]  # drop self: the function was looked up on the class
    # Ray's tracing wrapper adds this keyword; users never pass it.
    params = [p for p in params if p.name != ray_private.TRACE_CTX_KWARG]
    return sig.replace(parameters=params)


def _bind_error(sig: inspect.Signature, name: str, args: tuple, kwargs: dict) -> str | None:
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        positional = [
            p
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        takes = f"{len(positional)} positional argument{'s' if len(positional) != 1 else ''}"
        given = f"{len(args)} positional"
        if kwargs:
            given += f" and keyword(s) {', '.join(sorted(kwargs))}"
        return f"{name}() takes {takes} but {given} were bound: {exc}"
    return None


def check_method(rep: Names, node: Any, cls: type | None) -> None:
    """Unknown method (with a suggestion) and arguments that do not fit its signature.

    Example: ``w.fwd.bind(inp, 2.0, 3)`` on ``def fwd(self, x, scale=1.0)`` raises
    ``model.py:9: worker.fwd#0 (Worker.fwd): fwd() takes 2 positional arguments but 3
    positional were bound: ...; bind arguments that match def fwd(x, scale=1.0)``.

    Raises:
        CompileError: the method does not exist on the class, or the bound arguments do
            not bind to ``inspect.signature(method)`` (without ``self``).
    """
    if cls is None:
        return  # a live handle whose class cannot be imported: nothing to check against
    name = node.method
    if not callable(getattr(cls, name, None)):
        close = difflib.get_close_matches(name, method_names(cls), n=1)
        hint = (
            f"did you mean {close[0]!r}?"
            if close
            else (f"{cls.__name__} has methods {', '.join(method_names(cls)) or '(none)'}")
        )
        raise rep.fail(node, f"{cls.__name__} has no method {name!r}", hint)
    sig = _signature(cls, name)
    if sig is None:
        return
    problem = _bind_error(sig, name, node.args, node.kwargs)
    if problem:
        raise rep.fail(node, problem, f"bind arguments that match def {name}{sig}")


def check_ctor(rep: Names, actor: Any) -> None:
    """The constructor arguments of ``actor`` fit ``__init__``; no nodes among them.

    Example: ``Worker.bind(inp)`` raises ``model.py:7: actor worker (Worker.__init__): a
    graph node is passed to the actor's constructor, ...``.

    Raises:
        CompileError: a node among the constructor arguments, or arguments that do not bind.
    """
    from cgc.frontend.nodes import iter_nodes

    if any(True for _ in iter_nodes((actor.ctor_args, actor.ctor_kwargs))):
        raise rep.fail_actor(
            actor,
            "a graph node is passed to the actor's constructor, which runs once, before "
            "any input exists",
            "pass constants to Cls.bind(...) and graph values to method .bind(...) calls",
        )
    cls = actor.cls
    if cls is None or actor.external is not None:
        return
    sig: inspect.Signature | None
    if cls.__init__ is object.__init__:
        sig = inspect.Signature([])
    else:
        sig = _signature(cls, "__init__")
    if sig is None:
        return
    problem = _bind_error(sig, "__init__", actor.ctor_args, actor.ctor_kwargs)
    if problem:
        raise rep.fail_actor(
            actor, problem, f"give {cls.__name__}.bind(...) arguments that match def __init__{sig}"
        )


_TRANSPORTS = {
    "auto": pb.AUTO,
    "nccl": pb.NCCL,
    "accelerator": pb.NCCL,
    "shm": pb.HOST,
    "host": pb.HOST,
}
_DEVICES = {"default": pb.DEVICE_DEFAULT, "cpu": pb.CPU, "gpu": pb.GPU, "cuda": pb.GPU}


def _lookup(rep: Names, node: Any, hint: Any, value: Any, table: dict, what: str,
            fix: str) -> Any:
    """``table[value]`` (strings case-insensitive), or a CompileError naming the hint."""
    key = value.lower() if isinstance(value, str) else value
    if key not in table:
        raise rep.fail(node, f"unknown {what} {value!r}", fix, hint.loc)
    return table[key]


def hint_to_proto(
    rep: Names,
    node: Any,
    hint: HintSpec,
    *,
    is_input: bool,
    num_values: int,
    loc_proto: pb.SourceLoc,
) -> pb.TransportHint:
    """Validate one hint (what can be decided without placement) and encode it.

    Example: ``inp.with_tensor_transport("nccl")`` raises ``... input (graph input): an
    input cannot be sent over NCCL: the driver never joins a communicator; ...``.

    Raises:
        CompileError: an unknown transport or device, NCCL on an input (the driver never
            joins a communicator), NCCL to ``device="cpu"``, or ``direct_return`` on a
            value that is not a single tensor (a multi-return node as a whole).
    """
    t = _lookup(
        rep, node, hint, hint.transport, _TRANSPORTS, "tensor transport",
        "use 'auto', 'nccl', 'shm' or 'host' (communicator objects cannot be stored in a plan)",
    )
    d = _lookup(
        rep, node, hint, getattr(hint.device, "value", hint.device), _DEVICES, "device",
        "use 'default', 'cpu', 'gpu' or 'cuda'",
    )
    if t == pb.NCCL and is_input:
        raise rep.fail(
            node,
            "an input cannot be sent over NCCL: the driver never joins a communicator",
            "drop the hint or use transport='auto' (host memory, "
            "then device='gpu' to move it to the GPU)",
            hint.loc,
        )
    if t == pb.NCCL and d == pb.CPU:
        raise rep.fail(
            node,
            "NCCL transport with device='cpu' cannot hold: NCCL delivers on the GPU",
            "use transport='shm' for CPU delivery, or device='default'",
            hint.loc,
        )
    if hint.direct_return and num_values > 1:
        raise rep.fail(
            node,
            f"direct_return needs the value to be exactly one tensor, but "
            f"this node returns {num_values} values",
            "put the hint on one output "
            "(node[i].with_tensor_transport(...)) or drop _direct_return",
            hint.loc,
        )
    if (hint.shape is None) != (not hint.dtype):
        raise rep.fail(node, "a declared tensor needs both shape= and dtype=",
                       "pass both, e.g. shape=(8, 1024), dtype='float16'", hint.loc)
    if hint.dtype and hint.dtype not in DTYPE_BYTES:
        raise rep.fail(node, f"unknown tensor dtype {hint.dtype!r}",
                       f"use one of {', '.join(sorted(DTYPE_BYTES))}", hint.loc)
    if hint.shape is not None and not all(isinstance(x, int) and not isinstance(x, bool)
                                          and x >= 0 for x in hint.shape):
        raise rep.fail(node, f"tensor shape {hint.shape!r} is not a tuple of sizes >= 0",
                       "e.g. shape=(8, 1024)", hint.loc)
    out = pb.TransportHint(
        transport=t, device=d, static_shape=hint.static_shape, direct_return=hint.direct_return
    )
    if hint.shape is not None:
        out.spec.shape.extend(hint.shape)
        out.spec.dtype = hint.dtype
    out.loc.CopyFrom(loc_proto)
    out.requested = hint.requested
    return out



def encode_constant(
    rep: Names,
    consumer: Any,
    value: Any,
    path: str,
    *,
    allow_pickle: bool,
    actor: Any = None,
) -> tuple[pb.Value, bool]:
    """Encode a constant bound into ``consumer`` (or ``actor``'s constructor when given).

    Returns the encoded value and whether it had to be pickled (the plan then needs trust).

    Example::

        value, pickled = encode_constant(names, node, 3, "argument 1", allow_pickle=False)

    Raises:
        CompileError: the constant is not plain data and ``allow_pickle`` is off; the
            message names the node (or the actor's constructor) and the argument.
    """
    try:
        return encode_value(value, allow_pickle=allow_pickle, path=path)
    except ValueEncodeError as exc:
        fix = (
            "pass it through the graph's input instead, or allow pickled constants "
            "(--allow-pickle / allow_pickle=True; the plan then needs trust to load)"
        )
        if actor is not None:
            raise rep.fail_actor(actor, f"constructor {exc.problem}", fix) from None
        raise rep.fail(consumer, f"constant {exc.problem}", fix) from None


def actor_class(
    rep: Names,
    actor: Any,
    *,
    model_file: str | os.PathLike[str] | None,
    model_module: ModuleType | None,
) -> tuple[pb.ClassRef, pb.EmbeddedModule | None]:
    """The actor's class reference and the model module to embed (None when importable);
    a class of ``__main__`` comes back pickled in the reference.

    Example::

        ref, embedded = actor_class(names, actor, model_file=None, model_module=None)

    Raises:
        CompileError: the actors could not import the class (defined inside a function
            of an importable module), or a class of ``__main__`` cannot be pickled.
        OSError: the model file cannot be read.
    """
    ref, problem, embedded = class_ref(
        actor.class_module,
        actor.class_qualname,
        model_file=model_file,
        model_module=model_module,
        cls=actor.cls,
    )
    if problem:
        raise rep.fail_actor(actor, problem, "then compile again")
    return ref, embedded


def actor_options(rep: Names, actor: Any) -> pb.ActorOptions:
    """The actor's options as stored in a plan.

    Example::

        options = actor_options(names, actor)   # options.num_cpus == 1.0

    Raises:
        CompileError: a resource amount that is not a number, or a runtime_env that is
            not JSON-serializable.
    """
    options, problem = options_proto(actor.options)
    if problem:
        raise rep.fail_actor(
            actor, problem, "give numbers for resources and a JSON-serializable runtime_env"
        )
    return options
